package policylog

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// Log is what a reader and a writer need of the log: one totally ordered
// partition. Implementations bound every call by a deadline.
type Log interface {
	// Append writes one record (value nil = a tombstone) and returns its
	// offset.
	Append(ctx context.Context, key string, value []byte) (offset int64, err error)
	// Fetch returns entries from offset from on (possibly none, after a
	// short wait for new ones) and the end of the log (the offset the next
	// record will get).
	Fetch(ctx context.Context, from int64) (entries []Entry, end int64, err error)
}

// HistoryItem is one entry of the log and what became of it.
type HistoryItem struct {
	Offset int64
	LogKey string
	Result string // Applied, Refused or Ignored
	Code   string
	Reason string
	Meta
	Restates bool
	// Document is the policy file of an applied document record.
	Document string
}

// Client reads the log into a State and writes records to it. It is used
// by one goroutine at a time.
type Client struct {
	log     Log
	keep    bool
	st      *State
	history []HistoryItem
	// OnApply, when set, is told of every entry applied (for metrics).
	OnApply func(Entry, Outcome)
	keys    *Keyring
	signer  *Signer
	// prior: the checks a previous run made (UseChecked); checked: the
	// signatures that held in this run, in log order.
	prior   *Checked
	checked []checkedEntry

	// Checkpoints (checkpoint.go). planned: the first read looked for
	// one; plan: the checkpoint it relies on until its Through; vouched:
	// the records applied unverified under it; forged: the offsets read
	// whose signature does not hold; lastThrough: the Through of the
	// latest checkpoint read.
	planned     bool
	plan        *plan
	vouched     int
	forged      []int64
	lastThrough int64
	// CheckpointEvery: a write after this many records since the latest
	// checkpoint also writes one (0 = never; DefaultCheckpointEvery).
	CheckpointEvery int
	// CheckpointErr is why the last checkpoint a write tried failed.
	CheckpointErr error
	// OnCheckpoint, when set, is told what the first read made of the
	// checkpoint it relied on.
	OnCheckpoint func(CheckpointResult)
	// NoCheckpoints makes the client check every signature (the audit:
	// each record's own verdict); set before the first read.
	NoCheckpoints bool
	// held: what OnApply is told once the checkpoint matched (applied and
	// ignored records are counted only).
	held                     []heldOutcome
	heldApplied, heldIgnored int
	// next: the batch after the one being applied, fetched and prepared
	// meanwhile (fetchNext).
	next chan nextBatch
}

// NewClient returns a client that has read nothing yet. keep is passed to
// NewState, and makes the client keep the history of what it read
// (History, RecentHistory, DocumentAt: what writers print and roll back
// to); a reader that only enforces keeps neither, so that a log of a
// million overrides costs it only the overrides.
func NewClient(log Log, keep bool) *Client {
	return &Client{log: log, keep: keep, st: NewState(keep), CheckpointEvery: DefaultCheckpointEvery}
}

// Authenticate makes the client apply only records signed by a key of
// keys (State.Authenticate); call it before the first read.
func (c *Client) Authenticate(keys *Keyring) {
	c.keys = keys
	c.st.Authenticate(keys)
}

// UseChecked spares the signature checks that prior vouches for
// (checked.go); call it before the first read.
func (c *Client) UseChecked(prior *Checked) { c.prior = prior }

// Checked is the signatures that held in what the client read, for
// UseChecked on a later run. The caller must not keep it across reads.
func (c *Client) Checked() *Checked { return &Checked{entries: c.checked} }

// Sign makes the client sign every record it writes with s. With a
// keyring (Authenticate), a write by a key the keyring lacks is refused
// before anything is written.
func (c *Client) Sign(s *Signer) { c.signer = s }

// Identity is who the client writes as: its key's identity in its keyring
// ("" without a signer or a keyring, or when the keyring lacks the key).
func (c *Client) Identity() string {
	if c.signer == nil || c.keys == nil {
		return ""
	}
	id, _ := c.keys.Identity(c.signer.Public())
	return id
}

func (c *Client) newState() *State {
	st := NewState(c.keep)
	st.Authenticate(c.keys)
	return st
}

// encode is rec's log value: signed when the client has a signer.
func (c *Client) encode(rec *Record) ([]byte, error) {
	if c.signer != nil {
		return c.signer.Encode(rec)
	}
	r := *rec
	r.Sig = ""
	return r.Encode()
}

// ErrStartedOver is wrapped by the error Poll returns when the log ends
// before an offset the client has already read: it is another log (a
// broker that kept nothing, a topic deleted and created again). The
// client has then forgotten what it read, and its next Poll reads the new
// log from its start.
var ErrStartedOver = errors.New("the policy log started over")

// State is the state read so far. The caller must not change it.
func (c *Client) State() *State { return c.st }

// History is every entry read so far, in log order (none unless the
// client keeps records).
func (c *Client) History() []HistoryItem { return c.history }

// HistoryEntry is one record of the log as operators see it (the CLI's
// `policy history --json` and the operator API's history answer).
type HistoryEntry struct {
	Offset   int64     `json:"offset"`
	LogKey   string    `json:"logKey"`
	Result   string    `json:"result"`
	Code     string    `json:"code,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Revision int64     `json:"revision"`
	Kind     string    `json:"kind,omitempty"`
	Subject  string    `json:"subject,omitempty"`
	Author   string    `json:"author,omitempty"`
	Message  string    `json:"message,omitempty"`
	Time     time.Time `json:"time,omitzero"`
	SHA256   string    `json:"sha256,omitempty"`
}

// RecentHistory is the last limit records that changed or were refused,
// oldest first (limit <= 0: all); tombstones and restatements, which change
// nothing, are left out.
func (c *Client) RecentHistory(limit int) []HistoryEntry {
	var out []HistoryEntry
	for _, h := range c.history {
		if h.Result == Ignored {
			continue
		}
		out = append(out, HistoryEntry{Offset: h.Offset, LogKey: h.LogKey, Result: h.Result, Code: h.Code, Reason: h.Reason,
			Revision: h.Revision, Kind: h.Kind, Subject: h.Subject, Author: h.Author, Message: h.Message, Time: h.Time, SHA256: h.SHA256})
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

// OverrideEntry is an override in force as operators see it (the CLI's
// `override get|list --json` and the operator API's overrides answers).
type OverrideEntry struct {
	Key      string          `json:"key"`
	Scope    string          `json:"scope,omitempty"`
	Revision int64           `json:"revision"`
	Author   string          `json:"author"`
	Message  string          `json:"message"`
	Time     time.Time       `json:"time"`
	Override policy.Override `json:"override"`
}

// OverrideEntryOf is the entry of r, a record of an override in force
// (State.Override, State.OverrideRecords: never a tombstone).
func OverrideEntryOf(r Record) OverrideEntry {
	return OverrideEntry{Key: r.Key, Scope: r.Scope, Revision: r.Revision, Author: r.Author, Message: r.Message, Time: r.Time, Override: *r.Override}
}

// Poll fetches once from where the client stands and applies what came;
// it reports whether the client has reached the end of the log.
func (c *Client) Poll(ctx context.Context) (caughtUp bool, err error) {
	var (
		entries []Entry
		end     int64
		prep    []prepared
	)
	if f, ok := c.fetched(); ok {
		entries, end, prep = f.entries, f.end, f.prep
	} else if entries, end, err = c.log.Fetch(ctx, c.st.NextOffset()); err != nil {
		return false, err
	}
	if next := c.st.NextOffset(); end < next {
		// A reader only moves forward, so the log it read ended at or
		// after next.
		c.st, c.history, c.checked, c.forged, c.vouched, c.plan, c.planned = c.newState(), nil, nil, nil, 0, nil, false
		c.held, c.heldApplied, c.heldIgnored, c.lastThrough = nil, 0, 0, 0
		return false, fmt.Errorf("%w: it ends at offset %d, before offset %d already read", ErrStartedOver, end, next)
	}
	if !c.planned && !c.NoCheckpoints && c.keys != nil && c.st.NextOffset() == 0 && len(entries) > 0 && entries[len(entries)-1].Offset+1 < end {
		// A first read of a log longer than one fetch: rely on its
		// latest checkpoint, if any (checkpoint.go).
		c.planned = true
		if c.plan, err = c.findCheckpoint(ctx, end); err != nil {
			c.planned = false
			return false, err
		}
	}
	if prep == nil {
		prep = prepareAll(entries, c.st, c.plan, c.prior)
	}
	c.fetchNext(ctx, entries, end)
	for i, e := range entries {
		if e.Offset < c.st.NextOffset() {
			continue // a batch may start before the offset asked for
		}
		if c.plan != nil && e.Offset >= c.plan.rec.Checkpoint.Through && !c.settle("") {
			return false, nil // read again from the start, every signature checked
		}
		c.applyPrepared(e, prep[i].a, prep[i].d)
	}
	if c.plan != nil && c.st.NextOffset() >= end {
		// Its record is at or after Through: the log no longer holds it.
		c.settle("the log ends before the checkpoint's offset")
		return false, nil
	}
	if len(entries) == 0 && c.st.NextOffset() < end {
		// Nothing from where the client stands, yet the log goes on: the
		// records there were deleted (retention), every one of them.
		if s, ok := c.log.(interface {
			FirstOffset(context.Context) (int64, error)
		}); ok {
			first, err := s.FirstOffset(ctx)
			if err != nil {
				return false, err
			}
			if first > c.st.NextOffset() {
				c.st.lastOffset, c.st.compacted = first-1, true
			}
		}
	}
	return c.st.NextOffset() >= end, nil
}

// parallelFrom is the batch size from which entries are prepared on
// every CPU: checking a signature, and decoding a record, cost more than
// applying it, and a start reads the log in large batches.
const parallelFrom = 64

// prepared is an entry's signature judged and its value decoded: the
// apply rule's first two steps, which depend on nothing but the entry.
type prepared struct {
	a auth
	d decoded
}

// prepareAll prepares entries on every CPU for a large batch, with st's
// keyring, under the checkpoint p (nil: none) and sparing what prior
// vouches for; the records are then applied in log order. It changes
// nothing, and may run while the client applies another batch.
func prepareAll(entries []Entry, st *State, p *plan, prior *Checked) []prepared {
	out := make([]prepared, len(entries))
	prepare := func(i int) {
		e := entries[i]
		switch {
		case st.keys == nil:
		case p != nil && e.Offset < p.rec.Checkpoint.Through:
			out[i].a = st.vouch(e, p)
		default:
			out[i].a = st.authenticate(e, prior)
		}
		out[i].d = decodeEntry(e)
	}
	workers := min(runtime.GOMAXPROCS(0), len(entries)/parallelFrom+1)
	if workers == 1 {
		for i := range entries {
			prepare(i)
		}
		return out
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(entries); i += workers {
				prepare(i)
			}
		}()
	}
	wg.Wait()
	return out
}

// nextBatch is a batch fetched and prepared ahead (fetchNext).
type nextBatch struct {
	from    int64
	entries []Entry
	end     int64
	prep    []prepared
	err     error
}

// fetchNext fetches and prepares the batch after entries (a batch of a
// log that goes on past it, end) while the client applies entries: a
// start reads a long log batch after batch, and this keeps a second CPU
// busy meanwhile. The next Poll takes it (fetched).
func (c *Client) fetchNext(ctx context.Context, entries []Entry, end int64) {
	n := len(entries)
	if n < parallelFrom || entries[n-1].Offset+1 >= end {
		return
	}
	from := entries[n-1].Offset + 1
	// A checkpoint relied on now is relied on for the records below its
	// Through in the next batch too: settle drops it only on reaching
	// Through, and when it did not match, the client reads again from
	// the start and this batch is not used.
	st, p, prior := c.st, c.plan, c.prior
	ch := make(chan nextBatch, 1)
	c.next = ch
	go func() {
		b := nextBatch{from: from}
		if b.entries, b.end, b.err = c.log.Fetch(ctx, from); b.err == nil {
			b.prep = prepareAll(b.entries, st, p, prior)
		}
		ch <- b
	}()
}

// fetched is the batch fetchNext fetched, when it is the one the client
// reads next; ok is false otherwise, or when the fetch failed (the
// client then fetches again).
func (c *Client) fetched() (b nextBatch, ok bool) {
	if c.next == nil {
		return b, false
	}
	b = <-c.next
	c.next = nil
	return b, b.err == nil && b.from == c.st.NextOffset()
}

func (c *Client) apply(e Entry) Outcome {
	return c.applyPrepared(e, c.st.authenticate(e, c.prior), decodeEntry(e))
}

func (c *Client) applyPrepared(e Entry, a auth, d decoded) Outcome {
	o := c.st.applyDecoded(e, a, d)
	if a.signed {
		c.checked = append(c.checked, checkedEntry{off: e.Offset, sum: a.sum})
	}
	if a.forged {
		c.forged = append(c.forged, e.Offset)
	}
	if a.vouched {
		c.vouched++
	}
	if o.Record.Kind == KindCheckpoint && o.Result == Ignored && o.Record.Checkpoint != nil {
		c.lastThrough = max(c.lastThrough, o.Record.Checkpoint.Through)
	}
	if c.keep {
		h := HistoryItem{Offset: e.Offset, LogKey: e.Key, Result: o.Result, Code: o.Code, Reason: o.Reason, Meta: metaOf(&o.Record), Restates: o.Record.Restates}
		if o.Result == Applied && o.Record.changesDocument() {
			h.Document = o.Record.Document
		}
		c.history = append(c.history, h)
	}
	switch {
	case c.OnApply == nil:
	case c.plan == nil:
		c.OnApply(e, o)
	case o.Result == Refused:
		// Provisional until the checkpoint is compared (settle).
		e.Value = nil
		c.held = append(c.held, heldOutcome{e, o})
	case o.Result == Applied:
		c.heldApplied++
	default:
		c.heldIgnored++
	}
	return o
}

// heldOutcome is a refusal read under a checkpoint, told to OnApply once
// the checkpoint matched.
type heldOutcome struct {
	e Entry
	o Outcome
}

// Sync reads to the end of the log as it is now.
func (c *Client) Sync(ctx context.Context) error {
	for {
		done, err := c.Poll(ctx)
		if err != nil || done {
			return err
		}
	}
}

// ErrRefused is wrapped by the error Write returns for a refused record.
var ErrRefused = errors.New("refused")

// Refusal is a refused write: the outcome says why.
type Refusal struct{ Outcome Outcome }

func (r *Refusal) Error() string {
	return fmt.Sprintf("%s (%s): %s", ErrRefused, r.Outcome.Code, r.Outcome.Reason)
}

func (r *Refusal) Unwrap() error { return ErrRefused }

// NoExpect makes Write use the head it reads as the parent.
const NoExpect = -1

// Write appends rec as the next revision and waits until it has read it
// back: it returns the outcome when applied, a *Refusal when refused. The
// parent is expect (NoExpect = the head after a Sync); a record that would
// be refused (a stale expect, invalid content) is refused without writing.
// Author, Message and the content are the caller's; Time is set when zero.
//
// With NoExpect, a document or an override that loses its revision to
// another writer is rebased: written again on the new head, as long as
// nothing written meanwhile changed its own log key (the record in force
// for it is still the one this writer read). Records of different log keys
// commute, so this changes no outcome a reader computes: each attempt is
// an ordinary record judged by the apply rule, on every reader alike. A
// change of the same key meanwhile, or content the new head makes invalid
// (a document dropping a tier an override now uses), is refused, naming
// who wrote what.
//
// Every CheckpointEvery records, a write that was applied also writes a
// checkpoint (checkpoint.go), when the client can vouch for what it read.
func (c *Client) Write(ctx context.Context, rec Record, expect int64) (Outcome, error) {
	o, err := c.write(ctx, rec, expect)
	if err == nil {
		c.maybeCheckpoint(ctx, rec.Author)
	}
	return o, err
}

func (c *Client) write(ctx context.Context, rec Record, expect int64) (Outcome, error) {
	if err := c.Sync(ctx); err != nil {
		return Outcome{}, fmt.Errorf("read the policy log: %w", err)
	}
	rebase := expect == NoExpect && (rec.Kind == KindOverride || rec.Kind == KindPolicy)
	seen := c.keyRevision(rec)
	for attempt := 0; ; attempt++ {
		o, err := c.writeOnce(ctx, rec, expect)
		var ref *Refusal
		if !rebase || !errors.As(err, &ref) || o.Code != CodeConflict || attempt >= maxRebases {
			return o, err
		}
		if now := c.keyRevision(rec); now != seen {
			m, _ := c.st.Taken(now)
			o.Reason = fmt.Sprintf("%s was changed meanwhile: revision %d by %s (%q); head is %d", rec.Subject(), now, m.Author, m.Message, c.st.Head())
			if now < 0 {
				o.Reason = fmt.Sprintf("%s was deleted meanwhile; head is %d", rec.Subject(), c.st.Head())
			}
			return o, &Refusal{o}
		}
	}
}

// maxRebases bounds how often Write rebases one record; each rebase
// follows a record another writer got in first.
const maxRebases = 256

// keyRevision is the revision of the record in force for rec's log key
// (-1: none), for a document or an override.
func (c *Client) keyRevision(rec Record) int64 {
	if rec.Kind == KindPolicy {
		if c.st.doc == nil {
			return -1
		}
		return c.st.docRec.Revision
	}
	if tag, ok := c.st.ov.Tag(policy.OverrideKey{Key: rec.Key, Scope: rec.Scope}); ok {
		return tag.Revision
	}
	return -1
}

// writeOnce is one attempt of Write, on the head as read.
func (c *Client) writeOnce(ctx context.Context, rec Record, expect int64) (Outcome, error) {
	head := c.st.Head()
	rec.Parent = head
	if expect != NoExpect {
		rec.Parent = expect
	}
	rec.Revision = rec.Parent + 1
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	rec.Restates = false
	if c.keys != nil && (c.signer == nil || c.Identity() == "") {
		// What every reader would refuse is not written.
		o := c.st.refuse(rec, CodeUnauthenticated, "no signing key: the readers' keyring refuses an unsigned record")
		if c.signer != nil {
			o.Reason = fmt.Sprintf("the signing key (id %s) is not in the keyring: the readers would refuse what it signs", c.signer.KeyID())
		}
		return o, &Refusal{o}
	}
	rec.Seal()
	if rec.Parent != head {
		o := c.st.refuse(rec, CodeConflict, "")
		o.Taken, _ = c.st.Taken(rec.Parent + 1)
		o.Reason = fmt.Sprintf("expected revision %d, but the head is %d", expect, head)
		if o.Taken.Revision != 0 {
			o.Reason = fmt.Sprintf("expected revision %d, but revision %d was written meanwhile by %s (%s: %q); head is %d",
				expect, rec.Parent+1, o.Taken.Author, o.Taken.Subject, o.Taken.Message, head)
		}
		return o, &Refusal{o}
	}
	if err := c.st.validate(&rec); err != nil {
		o := c.st.refuse(rec, CodeInvalid, err.Error())
		if err == errAlreadyDecided {
			o = c.st.refuse(rec, CodeConflict, c.st.decidedReason(rec.Verdict))
		}
		return o, &Refusal{o}
	}
	o, err := c.append(ctx, rec)
	if err != nil {
		return o, err
	}
	if o.Result != Applied {
		// Another writer took the revision first: keep compaction from
		// leaving this refused record in place of the one in force.
		if err := c.restate(ctx, rec); err != nil {
			return o, fmt.Errorf("%w (and restating %s failed: %v)", &Refusal{o}, rec.LogKey(), err)
		}
		return o, &Refusal{o}
	}
	return o, nil
}

// append writes rec and reads the log up to it.
func (c *Client) append(ctx context.Context, rec Record) (Outcome, error) {
	b, err := c.encode(&rec)
	if err != nil {
		return Outcome{}, err
	}
	off, err := c.log.Append(ctx, rec.LogKey(), b)
	if err != nil {
		return Outcome{}, fmt.Errorf("write to the policy log: %w", err)
	}
	return c.readUpTo(ctx, off)
}

// readUpTo reads the log until the entry at off has been applied and
// returns its outcome.
func (c *Client) readUpTo(ctx context.Context, off int64) (Outcome, error) {
	for c.st.NextOffset() <= off {
		entries, _, err := c.log.Fetch(ctx, c.st.NextOffset())
		if err != nil {
			return Outcome{}, fmt.Errorf("read back from the policy log: %w", err)
		}
		for _, e := range entries {
			if e.Offset < c.st.NextOffset() {
				continue
			}
			o := c.apply(e)
			if e.Offset == off {
				return o, nil
			}
		}
	}
	return Outcome{}, fmt.Errorf("offset %d of the policy log was not read back (compacted meanwhile?)", off)
}

// maxRestates bounds how often a writer rewrites a record that another
// writer superseded while it wrote.
const maxRestates = 5

// restate rewrites the record in force of the refused record's log key
// (or "no override" when there is none), naming the refused record, until
// nothing of that key was applied while it wrote.
func (c *Client) restate(ctx context.Context, refused Record) error {
	logKey := refused.LogKey()
	for range maxRestates {
		cur, ok := c.recordOf(logKey)
		rev := int64(-1)
		if ok {
			rev = cur.Revision
		} else if logKey == RolloutKey {
			return nil // nothing in force to keep in place
		} else {
			cur = Record{Kind: refused.Kind, Key: refused.Key, Scope: refused.Scope, Deleted: true, Author: refused.Author,
				Message: "restated: no override", Time: time.Now().UTC()}
			cur.Seal()
		}
		cur.Restates = true
		cur.RefusedRevision, cur.RefusedSHA256 = refused.Revision, refused.SHA256
		b, err := c.encode(&cur)
		if err != nil {
			return err
		}
		off, err := c.log.Append(ctx, logKey, b)
		if err != nil {
			return err
		}
		if _, err := c.readUpTo(ctx, off); err != nil {
			return err
		}
		now := int64(-1)
		if cur, ok := c.recordOf(logKey); ok {
			now = cur.Revision
		}
		if now == rev {
			return nil
		}
	}
	return fmt.Errorf("%s kept changing while it was restated", logKey)
}

func (c *Client) recordOf(logKey string) (Record, bool) {
	if logKey == RolloutKey {
		if c.st.ro.rec == nil {
			return Record{}, false
		}
		return *c.st.ro.rec, true
	}
	if logKey == DocumentKey {
		if c.st.doc == nil {
			return Record{}, false
		}
		return c.st.docRec, true
	}
	r, ok := c.st.recs[logKey]
	if !ok {
		return Record{}, false
	}
	return *r, true
}
