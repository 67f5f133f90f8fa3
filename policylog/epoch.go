package policylog

// Epochs: a log that starts over.
//
// A policy log can be lost (a broker that kept nothing, a topic deleted
// and created again). Its replacement starts at offset 0 and, written by
// a careless writer, at revision 1: applied as is, it would silently
// replace every override in force. So a reader that held revision N of
// one log accepts another log only once it reaches an epoch record: a
// record of kind "epoch" (log key "epoch") that declares an epoch number
// above every one the reader has seen and carries the whole state (the
// document and every override in force) at a revision not below N.
// Applying it replaces the state read so far by the state it carries;
// records after it follow it by the usual rule (parent = head). Records
// of the new log before its latest epoch record are thus read and
// superseded by every reader alike: the state is a function of the log.
// `limiter policy restore` writes the epoch record, from policy_audit or a
// limiter's cache file.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// KindEpoch is an epoch record's kind, and EpochKey its log key.
const (
	KindEpoch = "epoch"
	EpochKey  = "epoch"
)

// epochContent is what an epoch record's SHA256 covers: its epoch, the
// document, and each override it carries (log key and content hash).
func (r *Record) epochContent() []byte {
	parts := []string{fmt.Sprint(r.Epoch), r.Document}
	for i := range r.State {
		parts = append(parts, r.State[i].LogKey(), r.State[i].SHA256)
	}
	b, _ := json.Marshal(parts) // strings always marshal
	return b
}

// decodeEpoch checks what Decode can of an epoch record: a positive
// epoch, a document, and override records that are each well formed.
func decodeEpoch(r *Record) error {
	if r.Kind != KindEpoch {
		if r.Epoch != 0 || r.State != nil {
			return fmt.Errorf("epoch and state belong to an epoch record, not a %s record", r.Kind)
		}
		return nil
	}
	if r.Epoch < 1 || r.Revision < 1 || r.Document == "" {
		return fmt.Errorf("an epoch record needs an epoch ≥ 1, a revision ≥ 1 and a document")
	}
	for i := range r.State {
		o := &r.State[i]
		if o.Kind != KindOverride || o.Key == "" || o.Override == nil || o.Deleted || o.Restates || o.State != nil {
			return fmt.Errorf("the state of an epoch record holds overrides in force only (entry %d)", i)
		}
		if h := hashHex(o.Content()); h != o.SHA256 {
			return fmt.Errorf("override %s in the epoch's state: content SHA-256 %s does not match the recorded %s", o.Subject(), h, o.SHA256)
		}
	}
	return nil
}

// applyEpoch applies an epoch record (see the comment at the top).
func (s *State) applyEpoch(rec Record) Outcome {
	if rec.Epoch <= s.epoch {
		return s.refuse(rec, CodeConflict, fmt.Sprintf("epoch %d is not after the epoch in force, %d", rec.Epoch, s.epoch))
	}
	if rec.Revision < s.head {
		return s.refuse(rec, CodeConflict, fmt.Sprintf("epoch %d starts at revision %d, below the head %d", rec.Epoch, rec.Revision, s.head))
	}
	doc, err := policy.Parse([]byte(rec.Document))
	if err != nil {
		return s.refuse(rec, CodeInvalid, err.Error())
	}
	ov := policy.NewOverrides(len(rec.State))
	for i := range rec.State {
		o := rec.State[i]
		if err := o.Override.Validate(doc); err != nil {
			return s.refuse(rec, CodeInvalid, fmt.Sprintf("override %s: %v", o.Subject(), err))
		}
		ov.PutTagged(policy.OverrideKey{Key: o.Key, Scope: o.Scope}, *o.Override, tagOf(&o))
	}
	docRec := Record{Revision: rec.Revision, Parent: rec.Parent, Kind: KindPolicy, Author: rec.Author, Message: rec.Message, Time: rec.Time, Document: rec.Document}
	docRec.Seal()
	s.doc, s.docRec, s.ov = doc, docRec, ov
	s.recs = map[string]*Record{}
	if s.keep {
		for i := range rec.State {
			o := rec.State[i]
			s.recs[o.LogKey()] = &o
		}
	}
	s.ro = rollouts{}
	s.recent = map[int64]Meta{rec.Revision: metaOf(&rec)}
	s.head, s.epoch = rec.Revision, rec.Epoch
	return Outcome{Result: Applied, Record: rec, Head: s.head}
}

// CompleteFrom is the first offset a log must still hold for what this
// State read to be the whole state: 0, or the offset of the epoch record
// in force (it carries everything before it).
func (s *State) CompleteFrom() int64 { return max(s.epochOffset, 0) }

// ErrLogUnsafe is wrapped by an error that says the log can lose records
// (a topic whose configuration lets retention delete them).
var ErrLogUnsafe = errors.New("the policy log can lose records")

// Epoch is the epoch in force: 0 until an epoch record is applied.
func (s *State) Epoch() int64 { return s.epoch }

// EpochRecord is the epoch record that restores st (a State that keeps
// content) as epoch epoch, sealed; its revision is st's head.
func EpochRecord(st *State, epoch int64, author, message string) (Record, error) {
	if st.doc == nil {
		return Record{}, fmt.Errorf("nothing to restore: no document in force")
	}
	ov := st.OverrideRecords()
	if len(ov) != st.Overrides() {
		return Record{}, fmt.Errorf("the state does not keep its override records")
	}
	rec := Record{Revision: st.head, Parent: st.head - 1, Kind: KindEpoch, Epoch: epoch, Author: author, Message: message,
		Document: st.docRec.Document, State: ov}
	for i := range rec.State {
		rec.State[i].Restates = false
		rec.State[i].RefusedRevision, rec.State[i].RefusedSHA256 = 0, ""
	}
	rec.Seal()
	return rec, nil
}

// Digest is the digest of the policy a State enforces: the document and
// every override in force as compiled (what resolution uses: a reason or
// an author does not change it), whatever the order they were written in.
// Two readers with the same digest enforce the same limits; a log
// restored from the audit or from a cache reaches the digest of the state
// it restores. Empty before a document.
func (s *State) Digest() string { return StateDigest(s.doc, s.ov) }

// StateDigest is the digest of doc with the overrides ov (see
// State.Digest). Each override's fields are hashed (64 bits, mix) and
// the hashes summed and XORed, an order-free combination; the document's
// hash, the count and both sums make the SHA-256 it returns (32 hex
// digits).
func StateDigest(doc *policy.Policy, ov *policy.Overrides) string {
	if doc == nil {
		return ""
	}
	// Summed over each part of the overrides on every CPU, then added up.
	type acc struct {
		sum, xor uint64
		n        int
	}
	accs := make([]acc, overrideParts(ov.Len()))
	inParts(len(accs), func(part int) {
		var a acc
		ov.EachTaggedPart(part, len(accs), func(k policy.OverrideKey, o policy.Override, _ policy.OverrideTag) {
			v := uint64(mixSeed)
			for _, s := range [...]string{k.Key, k.Scope, o.Tier, o.Store, o.QuotaPeriod} {
				v = mixString(v, s)
			}
			if o.Scope != "" { // digests of states without one stay what they were
				v = mixString(v, o.Scope)
			}
			var exp int64
			if !o.Expires.IsZero() {
				exp = o.Expires.UnixNano()
			}
			for _, w := range [...]uint64{math.Float64bits(o.Rate), uint64(o.Burst), uint64(o.Quota), uint64(exp)} {
				v = mix(v, w)
			}
			v = fmix(v)
			a.sum += v
			a.xor ^= v
			a.n++
		})
		accs[part] = a
	})
	var sum, xor uint64
	n := 0
	for _, a := range accs {
		sum, xor, n = sum+a.sum, xor^a.xor, n+a.n
	}
	h := sha256.New()
	h.Write([]byte(doc.Hash()))
	var tail [24]byte
	binary.LittleEndian.PutUint64(tail[0:], uint64(n))
	binary.LittleEndian.PutUint64(tail[8:], sum)
	binary.LittleEndian.PutUint64(tail[16:], xor)
	h.Write(tail[:])
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// The digest's per-override hash: 64-bit words multiplied in (FNV-1a's
// prime), each string 8 bytes at a time and closed by its length, then
// MurmurHash3's finalizer. It is an accident detector, not a MAC: it is
// fast because it runs over every override of a revision.
const (
	mixSeed  = 14695981039346656037
	mixPrime = 1099511628211
)

func mix(v, w uint64) uint64 { return (v ^ w) * mixPrime }

func mixString(v uint64, s string) uint64 {
	n := uint64(len(s))
	for len(s) >= 8 {
		v = mix(v, binary.LittleEndian.Uint64([]byte(s[:8])))
		s = s[8:]
	}
	var tail uint64
	for i := 0; i < len(s); i++ {
		tail |= uint64(s[i]) << (8 * i)
	}
	return mix(mix(v, tail), n) // the length tells "ab"+"" from "a"+"b"
}

func fmix(v uint64) uint64 {
	v ^= v >> 33
	v *= 0xff51afd7ed558ccd
	v ^= v >> 33
	v *= 0xc4ceb9fe1a85ec53
	v ^= v >> 33
	return v
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Restore writes into the log the epoch record that restores from (a
// State that keeps content, read from the audit or a cache) and returns
// its outcome once read back. The epoch declared is one above both the
// log's and from's. A log whose head is already past
// from's is not restored (its history is newer than what would replace
// it).
func (c *Client) Restore(ctx context.Context, from *State, author, message string) (Outcome, error) {
	if err := c.Sync(ctx); err != nil {
		return Outcome{}, fmt.Errorf("read the policy log: %w", err)
	}
	if h := c.st.Head(); h > from.Head() {
		return Outcome{}, fmt.Errorf("the log's head, revision %d, is after the state to restore (revision %d): nothing to restore", h, from.Head())
	}
	rec, err := EpochRecord(from, max(c.st.Epoch(), from.Epoch())+1, author, message)
	if err != nil {
		return Outcome{}, err
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	o, err := c.append(ctx, rec)
	if err != nil {
		return o, err
	}
	if o.Result != Applied {
		if o.Code == CodeConflict && c.st.Epoch() >= rec.Epoch {
			// Another restore got in first. Compaction keeps the latest
			// record of log key "epoch": this refused one, which a reader
			// of the compacted log would apply in place of the winner. So
			// the epoch in force is restated after it.
			_, doc := c.st.Document()
			o.Reason = fmt.Sprintf("another restore got in first: epoch %d is in force (revision %d, by %s: %q); this one was refused", c.st.Epoch(), c.st.Head(), doc.Author, doc.Message)
			if err := c.restateEpoch(ctx, rec, author); err != nil {
				return o, fmt.Errorf("%w (and restating epoch %d failed: %v)", &Refusal{o}, c.st.Epoch(), err)
			}
		}
		return o, &Refusal{o}
	}
	return o, nil
}

// restateEpoch writes the state in force as a restatement of the epoch in
// force, naming the refused epoch record: a no-op on the full log
// (State.apply), and on a compacted one, where it is the latest record of
// log key "epoch", the same state the full log reaches at its offset.
func (c *Client) restateEpoch(ctx context.Context, refused Record, author string) error {
	rec, err := EpochRecord(c.st, c.st.Epoch(), author, fmt.Sprintf("restated: epoch %d in force, after a concurrent restore (revision %d) was refused", c.st.Epoch(), refused.Revision))
	if err != nil {
		return err
	}
	rec.Time = time.Now().UTC()
	rec.Restates, rec.RefusedRevision, rec.RefusedSHA256 = true, refused.Revision, refused.SHA256
	o, err := c.append(ctx, rec)
	if err == nil && o.Result != Ignored {
		err = fmt.Errorf("the restatement was %s: %s", o.Result, o.Reason)
	}
	return err
}
