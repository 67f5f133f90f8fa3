package policylog

// Checkpoints: a start that does not check a million signatures.
//
// With a keyring, a reader checks the signature of every record it reads,
// and a log of a million overrides is a million Ed25519 verifications. A
// checkpoint record (kind "checkpoint", log key "checkpoint", so that
// compaction keeps the latest) is a writer's signed statement about the
// log below an offset, Through: it judged every record there, the
// signatures that do not hold are at the offsets it lists (Forged), and
// the state those records build is the one whose CheckpointDigest it
// carries, at revision Revision and epoch Epoch.
//
// # The rule for a reader
//
// A reader that starts from the log's beginning looks for the latest
// checkpoint whose own signature holds (near the end: writers write one
// every CheckpointEvery records). Below its Through it applies records
// without verifying their signatures: a record is judged as if its
// signature held, except at the offsets the checkpoint lists, refused
// with the same reason a verification gives; everything a signature check
// does not need (unsigned, a key the keyring lacks, until=) is judged as
// always. When it reaches Through it computes the digest of its state:
//
//   - equal to the checkpoint's: the records it applied are the ones the
//     writer judged, with the same outcomes (a forged record would have
//     changed the state, or the revisions), and it goes on verifying
//     every record from Through, one by one;
//   - different: it forgets what it read and reads the log again from its
//     start, checking every signature (a forged record is then refused and
//     audited as always). It is counted: a checkpoint that does not match
//     is a forgery, a checkpoint copied into another log, a reader whose
//     keyring differs from the writer's, or records written after the
//     checkpoint that compaction made it drop records before it (the
//     latest checkpoint is then too old; the next one written fixes it).
//
// Records at or after Through are always verified, and so is the
// checkpoint itself: the start of a log with a checkpoint costs one
// digest and the records written since, not one verification per record.
// A checkpoint changes no state: applied, it is "ignored", like a
// restatement.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// KindCheckpoint is a checkpoint record's kind, and CheckpointKey its log
// key.
const (
	KindCheckpoint = "checkpoint"
	CheckpointKey  = "checkpoint"
)

// DefaultCheckpointEvery is how many records a writer lets pass between
// checkpoints (Client.CheckpointEvery).
const DefaultCheckpointEvery = 1000

// maxForged bounds the offsets a checkpoint lists: past it a writer
// writes no checkpoint (and readers verify every record).
const maxForged = 4096

// Checkpoint is what a checkpoint record says about the log below
// Through (see the comment at the top).
type Checkpoint struct {
	Through int64   `json:"through"`
	Epoch   int64   `json:"epoch"`
	Digest  string  `json:"digest"`
	Forged  []int64 `json:"forged,omitempty"`
}

func (r *Record) checkpointContent() []byte {
	if r.Checkpoint == nil {
		return nil
	}
	b, _ := json.Marshal(r.Checkpoint) // plain fields always marshal
	return b
}

// decodeCheckpoint checks what Decode can of a checkpoint record.
func decodeCheckpoint(r *Record) error {
	if r.Kind != KindCheckpoint {
		if r.Checkpoint != nil {
			return fmt.Errorf("checkpoint belongs to a checkpoint record, not a %s record", r.Kind)
		}
		return nil
	}
	c := r.Checkpoint
	if c == nil || c.Through < 1 || len(c.Digest) != 64 || r.Revision < 1 || len(c.Forged) > maxForged {
		return fmt.Errorf("a checkpoint record needs a revision, an offset (through) ≥ 1, a digest and at most %d forged offsets", maxForged)
	}
	if !slices.IsSorted(c.Forged) || (len(c.Forged) > 0 && (c.Forged[0] < 0 || c.Forged[len(c.Forged)-1] >= c.Through)) {
		return fmt.Errorf("a checkpoint's forged offsets are sorted, below through")
	}
	return nil
}

// CheckpointDigest is the digest a checkpoint carries: SHA-256 over the
// epoch, the head, the document's record, the rollout part, and every
// override in force as compiled with the revision and hash of its record,
// hashed one by one and sorted (so the order they were written in does
// not count, and what resolution ignores, a reason, does through the
// record's hash). Unlike Digest, which detects accidents, it is meant to
// be hard to match by choosing records: a reader trusts what it applied
// unverified because of it. It costs one SHA-256 per override.
func (s *State) CheckpointDigest() string {
	h := sha256.New()
	var hdr []byte
	hdr = append(hdr, "ratewarden policy checkpoint v1\x00"...)
	for _, v := range [...]int64{s.epoch, s.head, s.docRec.Revision, s.ro.last} {
		hdr = binary.LittleEndian.AppendUint64(hdr, uint64(v))
	}
	hdr = appendField(hdr, s.docRec.SHA256)
	if s.ro.rec != nil {
		hdr = binary.LittleEndian.AppendUint64(hdr, uint64(s.ro.rec.Revision))
		hdr = appendField(hdr, s.ro.rec.SHA256)
	}
	if s.ro.open != nil {
		hdr = binary.LittleEndian.AppendUint64(hdr, uint64(s.ro.open.Record.Revision))
		hdr = appendField(hdr, s.ro.open.Record.SHA256)
	}
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(s.ov.Len()))
	h.Write(hdr)
	// The hashes of each part of the overrides, sorted, on every CPU,
	// then merged.
	parts := make([][][2]uint64, overrideParts(s.ov.Len()))
	inParts(len(parts), func(part int) {
		sums := make([][2]uint64, 0, s.ov.Len()/len(parts)+1)
		var buf []byte
		s.ov.EachTaggedPart(part, len(parts), func(k policy.OverrideKey, o policy.Override, tag policy.OverrideTag) {
			buf = buf[:0]
			for _, f := range [...]string{k.Key, k.Scope, o.Tier, o.Store, o.QuotaPeriod} {
				buf = appendField(buf, f)
			}
			var exp int64
			if !o.Expires.IsZero() {
				exp = o.Expires.UnixNano()
			}
			for _, w := range [...]uint64{math.Float64bits(o.Rate), uint64(o.Burst), uint64(o.Quota), uint64(exp), uint64(tag.Revision), tag.SHA} {
				buf = binary.LittleEndian.AppendUint64(buf, w)
			}
			sum := sha256.Sum256(buf)
			sums = append(sums, [2]uint64{binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:16])})
		})
		slices.SortFunc(sums, cmpSum)
		parts[part] = sums
	})
	out := make([]byte, 0, 16*1024)
	for {
		next := -1
		for i, p := range parts {
			if len(p) > 0 && (next < 0 || cmpSum(p[0], parts[next][0]) < 0) {
				next = i
			}
		}
		if next < 0 {
			break
		}
		v := parts[next][0]
		parts[next] = parts[next][1:]
		out = binary.BigEndian.AppendUint64(out, v[0])
		out = binary.BigEndian.AppendUint64(out, v[1])
		if len(out) == cap(out) {
			h.Write(out)
			out = out[:0]
		}
	}
	h.Write(out)
	return hex.EncodeToString(h.Sum(nil))
}

func cmpSum(a, b [2]uint64) int {
	if a[0] != b[0] {
		return cmpUint(a[0], b[0])
	}
	return cmpUint(a[1], b[1])
}

func cmpUint(a, b uint64) int {
	if a < b {
		return -1
	}
	return 1
}

func appendField(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint32(b, uint32(len(s))), s...)
}

// plan is the checkpoint a reader relies on until Through.
type plan struct {
	offset int64 // of the checkpoint record
	rec    Record
}

func (p *plan) forged(off int64) bool {
	_, ok := slices.BinarySearch(p.rec.Checkpoint.Forged, off)
	return ok
}

// vouch is authenticate for an entry below the plan's Through: judged as
// a verification would judge it, without one (see the comment at the
// top).
func (s *State) vouch(e Entry, p *plan) auth {
	if s.keys == nil || e.Value == nil {
		return auth{}
	}
	identity, id, until, err := s.keys.identify(e.Value)
	if err != nil {
		return auth{err: err}
	}
	if p.forged(e.Offset) {
		return auth{err: badSignature(id, identity), forged: true}
	}
	return auth{identity: identity, until: until, vouched: true}
}

// CheckpointResult is what a reader made of the checkpoint it relied on
// (Client.OnCheckpoint).
type CheckpointResult struct {
	Offset  int64 // of the checkpoint record
	Through int64
	// Matched: the state below Through has the checkpoint's digest, and
	// the records there were applied unverified; else they are read again,
	// every signature checked, and Reason says why.
	Matched bool
	Reason  string
	// Vouched is the number of records applied without their signature
	// checked; Applied and Ignored, when it matched, the records below
	// Through that were (OnApply is told of each refusal only).
	Vouched, Applied, Ignored int
}

// checkpointScan bounds how far back from the log's end a reader looks
// for a checkpoint (records).
const checkpointScan = 1 << 17

// findCheckpoint looks for the latest checkpoint whose signature holds
// near the end of the log (end is the log's end), and returns the plan to
// read by, or nil.
func (c *Client) findCheckpoint(ctx context.Context, end int64) (*plan, error) {
	hi := end
	window := int64(2048)
	for scanned := int64(0); hi > 0 && scanned < checkpointScan; {
		lo := max(0, hi-window)
		var found []Entry
		for from := lo; from < hi; {
			entries, _, err := c.log.Fetch(ctx, from)
			if err != nil {
				return nil, err
			}
			if len(entries) == 0 {
				break
			}
			for _, e := range entries {
				if e.Offset >= from && e.Offset < hi && e.Key == CheckpointKey && e.Value != nil {
					found = append(found, e)
				}
			}
			from = max(from+1, entries[len(entries)-1].Offset+1)
		}
		for i := len(found) - 1; i >= 0; i-- {
			e := found[i]
			a := c.st.authenticate(e, nil)
			if a.err != nil {
				continue
			}
			rec, err := Decode(e.Key, e.Value)
			if err != nil || rec.Kind != KindCheckpoint || rec.Checkpoint.Through > e.Offset {
				continue
			}
			if a.until != 0 && rec.Revision > a.until {
				continue
			}
			return &plan{offset: e.Offset, rec: rec}, nil
		}
		scanned += hi - lo
		hi = lo
		window *= 4
	}
	return nil, nil
}

// settle compares the state below the plan's Through with its
// checkpoint; on a mismatch the client forgets what it read, to read it
// again with every signature checked.
func (c *Client) settle(why string) bool {
	p := c.plan
	c.plan = nil
	cp := p.rec.Checkpoint
	res := CheckpointResult{Offset: p.offset, Through: cp.Through, Vouched: c.vouched}
	if why == "" {
		switch d := c.st.CheckpointDigest(); {
		case c.st.NextOffset() > cp.Through:
			why = fmt.Sprintf("read past its offset %d before comparing", cp.Through)
		case c.st.Head() != p.rec.Revision || c.st.Epoch() != cp.Epoch:
			why = fmt.Sprintf("the records below offset %d reach revision %d (epoch %d), the checkpoint says %d (epoch %d)",
				cp.Through, c.st.Head(), c.st.Epoch(), p.rec.Revision, cp.Epoch)
		case d != cp.Digest:
			why = fmt.Sprintf("the state below offset %d has digest %s, the checkpoint says %s", cp.Through, d[:16], cp.Digest[:16])
		}
	}
	res.Matched, res.Reason = why == "", why
	if res.Matched {
		res.Applied, res.Ignored = c.heldApplied, c.heldIgnored
	}
	held := c.held
	c.held, c.heldApplied, c.heldIgnored = nil, 0, 0
	if c.OnCheckpoint != nil {
		c.OnCheckpoint(res)
	}
	if why != "" {
		c.st, c.history, c.checked, c.forged, c.vouched = c.newState(), nil, nil, nil, 0
		return false
	}
	if c.OnApply != nil {
		for _, h := range held {
			c.OnApply(h.e, h.o)
		}
	}
	return true
}

// canCheckpoint reports whether the client may vouch for what it read: it
// checks signatures and signs with a key its keyring trusts.
func (c *Client) canCheckpoint() bool {
	return c.keys != nil && c.signer != nil && c.Identity() != ""
}

// ErrNoCheckpoint is wrapped by the error Checkpoint returns when the
// client may not write one.
var ErrNoCheckpoint = errors.New("no checkpoint written")

// Checkpoint writes a checkpoint of what the client has read to the end
// of the log, and returns its outcome (Ignored: it changes no state) once
// read back. It needs a keyring and a signing key the keyring trusts: a
// checkpoint vouches for the signatures its writer checked.
func (c *Client) Checkpoint(ctx context.Context, author, message string) (Outcome, error) {
	if !c.canCheckpoint() {
		return Outcome{}, fmt.Errorf("%w: a checkpoint vouches for checked signatures: it needs POLICY_TRUSTED_KEYS_FILE and a POLICY_SIGNING_KEY_FILE it trusts", ErrNoCheckpoint)
	}
	if err := c.Sync(ctx); err != nil {
		return Outcome{}, fmt.Errorf("read the policy log: %w", err)
	}
	if c.st.doc == nil {
		return Outcome{}, fmt.Errorf("%w: no policy document yet", ErrNoCheckpoint)
	}
	if len(c.forged) > maxForged {
		return Outcome{}, fmt.Errorf("%w: the log holds %d records whose signature does not hold, more than a checkpoint lists (%d)", ErrNoCheckpoint, len(c.forged), maxForged)
	}
	rec := Record{Revision: c.st.Head(), Parent: c.st.Head() - 1, Kind: KindCheckpoint, Author: author, Message: message, Time: time.Now().UTC(),
		Checkpoint: &Checkpoint{Through: c.st.NextOffset(), Epoch: c.st.Epoch(), Digest: c.st.CheckpointDigest(), Forged: slices.Clone(c.forged)}}
	rec.Seal()
	return c.append(ctx, rec)
}

// maybeCheckpoint writes a checkpoint when CheckpointEvery records were
// written since the last one (best effort: a write never fails for it).
func (c *Client) maybeCheckpoint(ctx context.Context, author string) {
	if c.CheckpointEvery <= 0 || !c.canCheckpoint() || c.st.NextOffset()-c.lastThrough < int64(c.CheckpointEvery) {
		return
	}
	_, c.CheckpointErr = c.Checkpoint(ctx, author, fmt.Sprintf("checkpoint: %d records since the last one", c.st.NextOffset()-c.lastThrough))
}
