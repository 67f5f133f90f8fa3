package policylog

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// Entry is one record of the log as read: its offset, log key and value
// (nil = a Kafka tombstone).
type Entry struct {
	Offset int64
	Key    string
	Value  []byte
}

// Results of applying an entry.
const (
	Applied = "applied"
	Refused = "refused"
	Ignored = "ignored" // a tombstone or a restatement: no change
)

// Refusal codes.
const (
	CodeConflict = "conflict" // the parent is not the head
	CodeInvalid  = "invalid"  // the content fails validation
	CodeGarbled  = "garbled"  // not a well-formed record
	// CodeUnauthenticated (keyring.go): not signed by a trusted key.
)

// Outcome is what the apply rule decided about one entry.
type Outcome struct {
	Result string // Applied, Refused or Ignored
	Code   string // for Refused: CodeConflict, CodeInvalid or CodeGarbled
	Reason string // for Refused: why, in words (every validation error)
	Record Record // as decoded (zero for a tombstone or a garbled value)
	// Head is the revision in force after the entry.
	Head int64
	// Taken is, for a conflict, the applied record that holds the revision
	// the refused one asked for (zero when it is no longer known).
	Taken Meta
	// Superseded is the rollout an applied document closed (0 = none).
	Superseded int64
}

// Meta is what history and conflicts say about an applied record.
type Meta struct {
	Revision int64
	Kind     string
	Subject  string
	Author   string
	Message  string
	Time     time.Time
	SHA256   string
}

func metaOf(r *Record) Meta {
	return Meta{Revision: r.Revision, Kind: r.Kind, Subject: r.Subject(), Author: r.Author, Message: r.Message, Time: r.Time, SHA256: r.SHA256}
}

// recentKept is how many applied records a State remembers for the
// reasons of conflicts.
const recentKept = 1024

// State is the policy log applied up to an offset: the head revision, the
// document in force and the overrides. Not safe for concurrent use: one
// reader owns it; Snapshot hands out immutable copies.
type State struct {
	head       int64
	lastOffset int64 // -1 before the first entry
	doc        *policy.Policy
	docRec     Record
	// ov is every override in force, each tagged with the revision and
	// hash of its record (what the apply rule compares); the policies in
	// force share it (Snapshot).
	ov *policy.Overrides
	// recs: per override log key, its record in force, when keep is set.
	recs   map[string]*Record
	keep   bool
	recent map[int64]Meta
	// compacted: a gap in offsets was seen (see validate).
	compacted bool
	// ro is the rollout part (rollout.go).
	ro rollouts
	// epoch is the epoch in force (epoch.go), epochOffset the offset of
	// its record (-1: none).
	epoch       int64
	epochOffset int64
	// keys, when set, is the keyring every value must be signed by
	// (keyring.go).
	keys *Keyring
}

// subject is what the apply rule compares of the record in force of a
// log key.
type subject struct {
	revision int64
	sha      uint64 // the first 64 bits of the record's SHA-256 (shaKey)
}

// NewState returns an empty state. keep makes it hold every override's
// record (for writers, which print them and restate them); a limiter
// keeps only what resolution needs.
func NewState(keep bool) *State {
	return &State{lastOffset: -1, epochOffset: -1, ov: policy.NewOverrides(0), recs: map[string]*Record{}, keep: keep, recent: map[int64]Meta{}}
}

// Authenticate makes the state apply only records signed by a key of
// keys, each authored by the key's identity (keyring.go); nil applies
// every record as its author names itself. Set it before the first Apply.
func (s *State) Authenticate(keys *Keyring) { s.keys = keys }

// auth is the judgement of an entry's signature: the identity of its key,
// or why it is refused.
type auth struct {
	identity string
	until    int64 // the key's last revision (0 = any)
	err      error
	sum      [16]byte // the digest of a signature that held (checked.go)
	signed   bool     // the signature held
	// forged: signed in form by a trusted key, but the signature does
	// not hold; vouched: not checked, a checkpoint vouches for it
	// (checkpoint.go).
	forged, vouched bool
}

// authenticate judges e's signature (zero without a keyring, or for a
// tombstone); prior, when it vouches for e, spares the check.
func (s *State) authenticate(e Entry, prior *Checked) auth {
	if s.keys == nil || e.Value == nil {
		return auth{}
	}
	var vouched func([16]byte) bool
	if prior != nil {
		vouched = func(sum [16]byte) bool { return prior.vouches(e.Offset, sum) }
	}
	id, until, sum, err := s.keys.check(e.Key, e.Value, vouched)
	return auth{identity: id, until: until, err: err, sum: sum, signed: err == nil, forged: errors.Is(err, errBadSignature)}
}

// Head is the revision in force (0 = nothing applied yet).
func (s *State) Head() int64 { return s.head }

// NextOffset is the offset after the last entry applied.
func (s *State) NextOffset() int64 { return s.lastOffset + 1 }

// Document is the document in force and its record (nil before one).
func (s *State) Document() (*policy.Policy, Record) { return s.doc, s.docRec }

// Overrides is the number of overrides in force.
func (s *State) Overrides() int { return s.ov.Len() }

// Override is the record in force of the override of (key, scope), when
// the State keeps content.
func (s *State) Override(key, scope string) (Record, bool) {
	r, ok := s.recs[OverrideLogKey(key, scope)]
	if !ok {
		return Record{}, false
	}
	return *r, true
}

// OverrideRecords lists the overrides in force by key and scope, when the
// State keeps content.
func (s *State) OverrideRecords() []Record {
	out := make([]Record, 0, len(s.recs))
	for _, r := range s.recs {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Scope < out[j].Scope
	})
	return out
}

// Taken is the applied record of revision rev, when still remembered.
func (s *State) Taken(rev int64) (Meta, bool) {
	m, ok := s.recent[rev]
	return m, ok
}

// Snapshot is the policy in force as an immutable value for the limiter
// (nil before a document is applied); now is the clock of expiry. It
// shares the overrides with the State (policy.Overrides.Snapshot): taking
// one copies nothing, and a later change copies only what it touches.
func (s *State) Snapshot(now func() time.Time) *policy.WithOverrides {
	if s.doc == nil {
		return nil
	}
	return policy.NewWithOverrides(s.doc, s.ov.Snapshot(), now)
}

// shaKey is the first 64 bits of a hex SHA-256: enough to tell one
// record of a log key from another, in 8 bytes instead of 80.
func shaKey(hexSum string) uint64 {
	if len(hexSum) < 16 {
		return 0
	}
	v, _ := strconv.ParseUint(hexSum[:16], 16, 64)
	return v
}

// Apply applies one entry in log order and says what became of it. It
// never fails: whatever the entry holds, the outcome is the same for every
// reader.
func (s *State) Apply(e Entry) Outcome { return s.apply(e, s.authenticate(e, nil)) }

// apply is Apply with e's signature already judged (a is zero without a
// keyring).
func (s *State) apply(e Entry, a auth) Outcome { return s.applyDecoded(e, a, decodeEntry(e)) }

// decoded is what Decode made of an entry's value: like the signature's
// judgement, it depends on the entry alone, so a reader computes both
// ahead of the apply rule, on every CPU (prepareAll).
type decoded struct {
	rec Record
	err error
}

func decodeEntry(e Entry) decoded {
	if e.Value == nil {
		return decoded{}
	}
	rec, err := Decode(e.Key, e.Value)
	return decoded{rec: rec, err: err}
}

// applyDecoded is apply with e's value already decoded (d is
// decodeEntry(e)).
func (s *State) applyDecoded(e Entry, a auth, d decoded) Outcome {
	gap := e.Offset != s.lastOffset+1 // records were compacted away before this one
	s.lastOffset = e.Offset
	s.compacted = s.compacted || gap
	if e.Value == nil {
		return Outcome{Result: Ignored, Head: s.head}
	}
	if a.err != nil {
		// Judged before anything else: what an untrusted record says is
		// not looked at. Its self-declared author is kept out of the
		// outcome's record (the audit's author is a proven identity) and
		// named in the reason.
		rec := d.rec
		reason := a.err.Error()
		if rec.Author != "" {
			reason += fmt.Sprintf(" (it names itself %q)", rec.Author)
		}
		rec.Author = ""
		return s.refuse(rec, CodeUnauthenticated, reason)
	}
	rec := d.rec
	if d.err != nil {
		return s.refuse(Record{}, CodeGarbled, d.err.Error())
	}
	if s.keys != nil {
		if a.until != 0 && rec.Revision > a.until {
			reason := fmt.Sprintf("signed by %s's key, retired after revision %d: revision %d is past it", a.identity, a.until, rec.Revision)
			rec.Author = ""
			return s.refuse(rec, CodeUnauthenticated, reason)
		}
		rec.Author = AuthorOf(a.identity, rec.Author)
	}
	if rec.Kind == KindCheckpoint {
		return Outcome{Result: Ignored, Record: rec, Head: s.head} // it changes no state (checkpoint.go)
	}
	if rec.Kind == KindEpoch {
		if rec.Restates && rec.Epoch <= s.epoch {
			// A restore that lost a race restated the epoch in force
			// (epoch.go): a no-op where that epoch was applied.
			return Outcome{Result: Ignored, Record: rec, Head: s.head}
		}
		o := s.applyEpoch(rec)
		if o.Result == Applied {
			s.epochOffset = e.Offset
		}
		return o
	}
	if rec.Restates {
		return s.restate(rec)
	}
	if rec.Revision != rec.Parent+1 {
		return s.refuse(rec, CodeGarbled, fmt.Sprintf("revision %d does not follow its parent %d", rec.Revision, rec.Parent))
	}
	switch {
	case rec.Parent == s.head:
	case rec.Parent > s.head && s.compacted:
		// Records before were superseded by compaction: the head read so
		// far may be behind the one this record was written on. (On the
		// full log a writer's parent is never ahead: it read the head.)
	case rec.Parent > s.head:
		return s.refuse(rec, CodeConflict, fmt.Sprintf("parent revision %d is ahead of the head %d", rec.Parent, s.head))
	default:
		o := s.refuse(rec, CodeConflict, "")
		o.Taken, _ = s.Taken(rec.Parent + 1)
		o.Reason = fmt.Sprintf("revision %d was written meanwhile (head is %d)", rec.Parent+1, s.head)
		if o.Taken.Revision != 0 {
			o.Reason = fmt.Sprintf("revision %d was written meanwhile by %s (%s: %q); head is %d",
				rec.Parent+1, o.Taken.Author, o.Taken.Subject, o.Taken.Message, s.head)
		}
		return o
	}
	if err := s.validate(&rec); err != nil {
		if err == errAlreadyDecided {
			return s.refuse(rec, CodeConflict, s.decidedReason(rec.Verdict))
		}
		return s.refuse(rec, CodeInvalid, err.Error())
	}
	var superseded int64
	if o := s.ro.open; o != nil && rec.Kind == KindPolicy {
		superseded = o.Record.Revision
	}
	s.install(rec)
	s.head = rec.Revision
	s.recent[rec.Revision] = metaOf(&rec)
	delete(s.recent, rec.Revision-recentKept)
	return Outcome{Result: Applied, Record: rec, Head: s.head, Superseded: superseded}
}

func (s *State) refuse(rec Record, code, reason string) Outcome {
	return Outcome{Result: Refused, Code: code, Reason: reason, Record: rec, Head: s.head}
}

// restate applies a restatement where its log key holds an older record
// or the refused one it names (see the package comment); elsewhere, and
// always on the full log, it is a no-op.
func (s *State) restate(rec Record) Outcome {
	lk := rec.LogKey()
	if lk == RolloutKey {
		return s.restateRollout(rec)
	}
	var cur subject
	ok := false
	if lk == DocumentKey {
		if s.doc != nil {
			cur, ok = subject{revision: s.docRec.Revision, sha: shaKey(s.docRec.SHA256)}, true
		}
	} else {
		var tag policy.OverrideTag
		tag, ok = s.ov.Tag(policy.OverrideKey{Key: rec.Key, Scope: rec.Scope})
		cur = subject{revision: tag.Revision, sha: tag.SHA}
	}
	wrong := ok && rec.RefusedRevision != 0 && cur.revision == rec.RefusedRevision && cur.sha == shaKey(rec.RefusedSHA256)
	ignored := Outcome{Result: Ignored, Record: rec, Head: s.head}
	if rec.Deleted { // the key had no override
		if !wrong {
			return ignored
		}
		s.ov.Delete(policy.OverrideKey{Key: rec.Key, Scope: rec.Scope})
		delete(s.recs, lk)
		return Outcome{Result: Applied, Record: rec, Head: s.head}
	}
	if ok && !wrong && cur.revision >= rec.Revision {
		return ignored
	}
	if rec.Kind == KindVerdict { // a promote: its rollout is long closed
		if err := s.validateDocument(rec.Document); err != nil {
			return s.refuse(rec, CodeInvalid, err.Error())
		}
		s.install(rec)
		s.head = max(s.head, rec.Revision)
		return Outcome{Result: Applied, Record: rec, Head: s.head}
	}
	if err := s.validate(&rec); err != nil {
		return s.refuse(rec, CodeInvalid, err.Error())
	}
	s.install(rec)
	s.head = max(s.head, rec.Revision)
	return Outcome{Result: Applied, Record: rec, Head: s.head}
}

// validate checks the content against the state in force. On a log that
// compaction has thinned (a gap seen), what is present is exactly what was
// in force at this point of the full log (each log key's latest record),
// but an absence proves nothing: the document or override a record was
// checked against may be superseded by a record further on. So checks of
// absence (no document yet, nothing to delete) are then skipped; the full
// log judged them.
func (s *State) validate(rec *Record) error {
	switch rec.Kind {
	case KindPolicy:
		return s.validateDocument(rec.Document)
	case KindRollout, KindVerdict:
		return s.validateRollout(rec)
	case KindOverride:
		if rec.Deleted {
			if _, ok := s.ov.Tag(policy.OverrideKey{Key: rec.Key, Scope: rec.Scope}); !ok && !s.compacted {
				return fmt.Errorf("no override of %s to delete", rec.Subject())
			}
			return nil
		}
		if rec.Override == nil {
			return fmt.Errorf("an override record without an override")
		}
		if s.doc == nil && !s.compacted {
			return fmt.Errorf("no policy document yet: push one before overrides")
		}
		if rec.Scope != "" && rec.Override.Store != "" {
			// A key is decided by exactly one store: its quota and leases
			// span its scopes.
			return fmt.Errorf("store: routes the whole key: set it on the override of %q without a scope", rec.Key)
		}
		return rec.Override.Validate(s.doc) // nil: the tier is not checked
	}
	return nil
}

// validateDocument checks a document as a push of it would be checked.
func (s *State) validateDocument(doc string) error {
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		return err
	}
	return s.strands(p)
}

// strands refuses a document that drops a tier some override names: the
// override would otherwise resolve to nothing.
func (s *State) strands(p *policy.Policy) error {
	missing := s.ov.MissingTiers(p)
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the document drops tiers that overrides use: %s", strings.Join(missing, "; "))
}

// install makes rec the record in force of its log key.
func (s *State) install(rec Record) {
	if rec.changesDocument() {
		s.doc, _ = policy.Parse([]byte(rec.Document)) // validated just before
		s.docRec = rec
	}
	switch rec.Kind {
	case KindPolicy, KindRollout, KindVerdict:
		s.installRollout(rec)
	case KindOverride:
		k := policy.OverrideKey{Key: rec.Key, Scope: rec.Scope}
		if rec.Deleted {
			s.ov.Delete(k)
			if s.keep {
				delete(s.recs, rec.LogKey())
			}
			return
		}
		s.ov.PutTagged(k, *rec.Override, tagOf(&rec))
		if s.keep {
			r := rec
			s.recs[rec.LogKey()] = &r
		}
	}
}

// tagOf is what the override set keeps of an override's record rec: its
// revision and hash, and who wrote it (the author the reader recorded:
// its signing key's identity when the log is signed) and why.
func tagOf(rec *Record) policy.OverrideTag {
	return policy.OverrideTag{Revision: rec.Revision, SHA: shaKey(rec.SHA256), Author: rec.Author, Reason: rec.Override.Reason, Message: rec.Message}
}

// Records is the state as a compacted log: the document's record, then
// every override's in revision order, each restating itself. Applying
// them to an empty State rebuilds this one (the limiter's cache file).
// It needs a State that keeps content, or returns the document only.
func (s *State) Records() []Record {
	var out []Record
	if s.doc != nil {
		out = append(out, s.docRec) // first: the overrides are checked against it
	}
	ov := s.OverrideRecords()
	sort.SliceStable(ov, func(i, j int) bool { return ov[i].Revision < ov[j].Revision })
	out = append(out, ov...)
	for i := range out {
		out[i].Restates = true
	}
	return out
}

// EachOverride calls fn for every override in force, in no order, in its
// compiled form (policy.Overrides.Each).
func (s *State) EachOverride(fn func(policy.OverrideKey, policy.Override)) { s.ov.Each(fn) }

// walkParallel is the number of overrides from which a walk of every
// override (a digest, the cache) is split among every CPU.
const walkParallel = 1 << 14

// overrideParts is how many parts a walk of n overrides is split into
// (policy.Overrides.EachTaggedPart), one goroutine each.
func overrideParts(n int) int { return max(1, min(runtime.GOMAXPROCS(0), n/walkParallel)) }

// inParts runs fn for each part 0 … parts-1 at the same time, and
// returns when all have.
func inParts(parts int, fn func(part int)) {
	if parts == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	for part := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(part)
		}()
	}
	wg.Wait()
}
