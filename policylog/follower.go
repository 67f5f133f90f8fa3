package policylog

// A Follower is a limiter's reader of the policy log (POLICY_SOURCE=kafka):
// one goroutine (Run) owns the Client and is the only writer of the state;
// each revision it reaches at the end of what the log holds becomes one
// immutable policy, swapped into the target with one call (SetPolicy),
// between decisions. /readyz and the metrics read atomics.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
)

// Policy sources, the values of /readyz's policy.source and of the
// limiter_policy_source gauge's label.
const (
	SourceFile      = "file"      // POLICY_SOURCE=file
	SourceKafka     = "kafka"     // the policy log, read to its end
	SourceCache     = "cache"     // the last revision applied, from POLICY_CACHE_DIR (the log unreachable)
	SourceBootstrap = "bootstrap" // POLICY_FILE: the log empty, or unreachable with no cache
)

// Statuses of the log in log mode (Info.Status).
const (
	StatusOK      = "ok"
	StatusFailing = "failing"
	StatusStale   = "stale"
	StatusUnsafe  = "unsafe"
)

// Info is the policy in force as /readyz's policy shows it.
type Info struct {
	Version int    `json:"version"`
	Hash    string `json:"hash"`
	File    string `json:"file"`
	// Revision is the policy log's revision in force (0 in file mode, or
	// from the bootstrap file); Source says where the policy came from:
	// file, kafka, cache or bootstrap.
	Revision  int64  `json:"revision"`
	Source    string `json:"source"`
	Overrides int    `json:"overrides,omitempty"`
	Author    string `json:"author,omitempty"`
	// Epoch is the policy log's epoch in force (0 until a restore);
	// Digest the digest of the policy in force (State.Digest): limiters
	// that enforce the same policy show the same digest.
	Epoch  int64  `json:"epoch,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Status, in log mode: "ok"; "failing" while the log cannot be read;
	// "stale" while the log read is not one this limiter may apply (it
	// started over below the revision in force, without a new epoch):
	// the revision in force stays, and LogError says why.
	Status string `json:"status,omitempty"`
	// LogError: in log mode, why the log cannot be read or applied now
	// (the revision in force stays); empty while it can.
	LogError string `json:"logError,omitempty"`
	// LogUnsafe: in log mode, why the topic can lose records or has lost
	// some (its retention, a start that is not compaction's); Status is
	// then "unsafe" unless it is worse.
	LogUnsafe string `json:"logUnsafe,omitempty"`
	// Rollout is the open rollout of the policy log, if any.
	Rollout *RolloutInfo `json:"rollout,omitempty"`
	// Signed, in log mode: this limiter trusts only records signed by a
	// key of its keyring (POLICY_TRUSTED_KEYS_FILE), and refuses any
	// other as unauthenticated. Writers read it before they write
	// (limiter policy push with LIMITER_FLEET_URLS).
	Signed bool `json:"signed,omitempty"`
	// Refused, in log mode: the last record this limiter refused since it
	// started, if any (a writer that sees its record here is told so).
	Refused *RefusedInfo `json:"refused,omitempty"`
}

// RefusedInfo is /readyz's policy.refused: a record refused, by the hash
// of its content, with the refusal's code and reason.
type RefusedInfo struct {
	Revision int64  `json:"revision"`
	SHA256   string `json:"sha256"`
	Code     string `json:"code"`
	Reason   string `json:"reason"`
}

// RolloutInfo is /readyz's policy.rollout: the open rollout.
type RolloutInfo struct {
	// Revision is the rollout record's revision, the shadow revision the
	// decision events carry.
	Revision         int64     `json:"revision"`
	EndsAt           time.Time `json:"endsAt"`
	ShadowFor        string    `json:"shadowFor"`
	MaxNewlyRejected float64   `json:"maxNewlyRejected"`
	Author           string    `json:"author,omitempty"`
	Message          string    `json:"message,omitempty"`
}

// RolloutInfoOf is the open rollout of st (nil = none).
func RolloutInfoOf(st *State) *RolloutInfo {
	ro, ok := st.Rollout()
	if !ok {
		return nil
	}
	r := ro.Record
	return &RolloutInfo{Revision: r.Revision, EndsAt: r.Rollout.EndsAt, ShadowFor: r.Rollout.ShadowFor,
		MaxNewlyRejected: r.Rollout.MaxNewlyRejected, Author: r.Author, Message: r.Message}
}

// FollowedLog is the log a Follower reads: a Log whose existence it
// checks before reading it (Exists: an error wrapping ErrNoTopic when it
// does not exist; a reader creates nothing), and closes when it stops.
type FollowedLog interface {
	Log
	Exists(ctx context.Context) error
	Close()
}

// ErrNoTopic is wrapped by the errors of a log whose topic does not
// exist. A reader takes it for an empty log, creates nothing, and says so.
var ErrNoTopic = errors.New("the policy topic does not exist")

// IntegrityChecker is a log that can say whether it can lose records
// (an error wrapping ErrLogUnsafe) and where it starts now; a Follower
// whose log is one checks it at start and every CheckEvery.
type IntegrityChecker interface {
	CheckIntegrity(ctx context.Context) (first int64, err error)
}

// RolloutTarget is what follows the open rollout (the shadow evaluator).
type RolloutTarget interface {
	SetRollout(p enforcement.Policy, rev int64)
}

// FollowerConfig is what a Follower reads and where it reports.
type FollowerConfig struct {
	Log       FollowedLog
	Topic     string        // POLICY_TOPIC, recorded in the cache
	CacheDir  string        // POLICY_CACHE_DIR; empty = no cache
	StartWait time.Duration // POLICY_START_WAIT: how long Start waits for the log
	Bootstrap string        // POLICY_FILE: the policy while the log is empty
	Metrics   *Metrics      // required
	Logger    *slog.Logger  // required
	// CheckEvery is how often the log's integrity is checked, when the
	// log is an IntegrityChecker (default 1 minute).
	CheckEvery time.Duration
	// Keys, when set, is the keyring every record must be signed by
	// (POLICY_TRUSTED_KEYS_FILE; keyring.go).
	Keys *Keyring
}

// Follower is the limiter's reader of the policy log.
type Follower struct {
	cfg    FollowerConfig
	client *Client
	info   atomic.Pointer[Info]
	rev    atomic.Int64
	// unsafe is Info.LogUnsafe (the last integrity check's verdict);
	// checked is when it was made.
	unsafe  atomic.Pointer[string]
	checked time.Time
	// refused is the last record refused (Info.Refused); nil until one is.
	refused atomic.Pointer[RefusedInfo]

	// Target receives each new policy; Shadow, when set, follows the open
	// rollout; Missing, when set, lists the stores a policy routes keys to
	// that this limiter lacks (logged). Set before Run.
	Target  interface{ SetPolicy(enforcement.Policy) }
	Shadow  RolloutTarget
	Missing func(enforcement.Policy) []string

	rolloutRev int64 // the rollout Shadow was given (0 = none)
	// held, while set, is the policy in force that the log read may not
	// replace yet (Run is its only user after Start).
	held *held
	// prior is the signature checks of the previous run (checked.go),
	// used by Start only.
	prior *Checked
}

// NewFollower returns a follower that has read nothing yet.
func NewFollower(cfg FollowerConfig) *Follower {
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = time.Minute
	}
	f := &Follower{cfg: cfg}
	if cfg.Keys != nil && cfg.CacheDir != "" {
		p, err := LoadChecked(filepath.Join(cfg.CacheDir, CheckedFile))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			cfg.Logger.Warn("policy cache: checked signatures unreadable; every signature is checked again", "err", err)
		}
		f.prior = p
	}
	f.client = f.newClient()
	f.info.Store(&Info{})
	f.unsafe.Store(new(string))
	return f
}

func (f *Follower) newClient() *Client {
	// Records are not kept: a limiter holds only what resolution needs
	// (the cache is written from the compiled overrides).
	c := NewClient(f.cfg.Log, false)
	c.Authenticate(f.cfg.Keys)
	c.UseChecked(f.prior)
	c.OnApply = func(e Entry, o Outcome) {
		f.cfg.Metrics.records.WithLabelValues(o.Result, o.Code).Inc()
		if o.Result == Refused {
			f.refused.Store(&RefusedInfo{Revision: o.Record.Revision, SHA256: o.Record.SHA256, Code: o.Code, Reason: o.Reason})
			f.cfg.Logger.Warn("policy log: record refused", "offset", e.Offset, "log_key", e.Key, "code", o.Code,
				"reason", o.Reason, "revision", o.Record.Revision, "author", o.Record.Author)
		}
	}
	c.OnCheckpoint = func(r CheckpointResult) {
		if !r.Matched {
			f.cfg.Metrics.checkpoints.WithLabelValues("mismatch").Inc()
			f.cfg.Logger.Error("policy log: the checkpoint does not match the records below it; reading the log again, every signature checked",
				"checkpoint_offset", r.Offset, "through", r.Through, "reason", r.Reason)
			return
		}
		f.cfg.Metrics.checkpoints.WithLabelValues("matched").Inc()
		f.cfg.Metrics.records.WithLabelValues(Applied, "").Add(float64(r.Applied))
		f.cfg.Metrics.records.WithLabelValues(Ignored, "").Add(float64(r.Ignored))
		f.cfg.Logger.Info("policy log: the records below the checkpoint applied without checking each signature (the checkpoint's digest matches)",
			"checkpoint_offset", r.Offset, "through", r.Through, "vouched", r.Vouched)
	}
	return c
}

// Current is the policy in force, for /readyz.
func (f *Follower) Current() Info {
	info := *f.info.Load()
	info.Refused = f.refused.Load()
	if u := *f.unsafe.Load(); u != "" {
		info.LogUnsafe = u
		if info.Status == StatusOK {
			info.Status = StatusUnsafe
		}
	}
	return info
}

// published is the Info last published, without the integrity verdict
// Current adds to it: what the follower compares with the log read and
// stores again. An "unsafe" status is not the "ok" one published (a
// revision in force would be swapped in again at every read), and a
// verdict stored with it would outlive the check that made it.
func (f *Follower) published() Info { return *f.info.Load() }

// checkIntegrity asks the log whether it can lose records, and whether
// it starts after what the state read proves complete (CompleteFrom).
func (f *Follower) checkIntegrity(ctx context.Context) {
	ch, ok := f.cfg.Log.(IntegrityChecker)
	if !ok {
		return
	}
	f.checked = time.Now()
	first, err := ch.CheckIntegrity(ctx)
	why := ""
	switch {
	case errors.Is(err, ErrLogUnsafe):
		why = err.Error()
	case err != nil:
		f.cfg.Metrics.errors.Inc()
		f.cfg.Logger.Warn("policy log: cannot check the topic's integrity; the last verdict stays", "err", err)
		return
	case first > f.client.State().CompleteFrom():
		why = fmt.Sprintf("the policy log starts at offset %d: records before it were deleted (retention or DeleteRecords, never compaction), "+
			"so the overrides they held may be missing here; restore the log (limiter policy restore) and make its retention unbounded", first)
	}
	if why != *f.unsafe.Load() {
		if why != "" {
			f.cfg.Logger.Error("policy log: "+why, "topic", f.cfg.Topic)
		} else {
			f.cfg.Logger.Info("policy log: the topic can no longer lose records", "topic", f.cfg.Topic)
		}
	}
	f.unsafe.Store(&why)
	f.cfg.Metrics.unsafe.Set(float64(boolInt(why != "")))
}

// Revision is the revision in force (decision events carry it).
func (f *Follower) Revision() int64 { return f.rev.Load() }

// State is the state read so far; only Run's goroutine (or the caller of
// Start, before Run) may use it.
func (f *Follower) State() *State { return f.client.State() }

// Close releases the log's connections (Run does when it ends).
func (f *Follower) Close() { f.cfg.Log.Close() }

// Start reads the log to its end, within StartWait, and returns the
// policy to start with: the log's, else the cache's, else the bootstrap
// file's. It fails only when none of them can be read.
func (f *Follower) Start(ctx context.Context) (enforcement.Policy, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.StartWait)
	defer cancel()
	missing := ""
	read := func() error {
		err := f.cfg.Log.Exists(ctx)
		if errors.Is(err, ErrNoTopic) {
			// Nothing to read, and nothing is created: a reader never
			// makes the log (a mistyped POLICY_TOPIC would start an empty
			// one). It is read once a writer creates it.
			missing = err.Error()
			return nil
		}
		if err == nil {
			missing = ""
			err = f.client.Sync(ctx)
		}
		return err
	}
	err := read()
	for err != nil && ctx.Err() == nil {
		f.cfg.Metrics.errors.Inc()
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
			err = read()
		}
	}
	if err == nil && missing != "" {
		f.cfg.Logger.Error("policy log: "+missing+"; a writer (limiter policy push) creates it", "topic", f.cfg.Topic)
		defer func() {
			if cur := f.published(); cur.Status == StatusOK {
				f.setStatus(StatusFailing, missing)
			}
		}()
	}
	if err == nil {
		// What the start checked is all the previous run could vouch for.
		f.prior = nil
		f.client.UseChecked(nil)
		f.checkIntegrity(ctx)
		if snap, info, cerr := ReadCache(f.cfg.CacheDir, f.cfg.Topic); cerr == nil {
			h := held{revision: info.Revision, epoch: info.Epoch}
			if st := f.client.State(); !h.accepts(st) {
				// The log lost what this limiter applied before it
				// stopped: enforce that, and say why.
				f.held = &h
				info.Status, info.LogError = StatusStale, h.staleReason(st)
				f.publish(info)
				f.cfg.Logger.Error("policy log: "+info.LogError, "topic", f.cfg.Topic)
				return snap, nil
			}
		}
		if p, info := f.fromState(f.client.State(), SourceKafka); p != nil {
			info.Digest = f.client.State().Digest()
			f.publish(info)
			f.writeCache()
			return p, nil
		}
		f.cfg.Logger.Warn("policy log is empty: enforcing the bootstrap POLICY_FILE until a document is pushed", "file", f.cfg.Bootstrap)
		return f.bootstrap()
	}
	f.cfg.Metrics.errors.Inc()
	f.client = f.newClient() // what was read of an unfinished start is read again
	f.cfg.Logger.Error("policy log unreachable at start; starting from the last revision applied, else POLICY_FILE",
		"topic", f.cfg.Topic, "err", err, "cache_dir", f.cfg.CacheDir)
	if snap, info, err := ReadCache(f.cfg.CacheDir, f.cfg.Topic); err == nil {
		// Once the log is read again, it replaces the cache only if it
		// holds what the cache does (a log lost meanwhile does not).
		f.held = &held{revision: info.Revision, epoch: info.Epoch}
		f.publish(info)
		return snap, nil
	} else if f.cfg.CacheDir != "" {
		f.cfg.Logger.Warn("no usable policy cache", "err", err)
	}
	return f.bootstrap()
}

func (f *Follower) bootstrap() (enforcement.Policy, error) {
	p, err := policy.Load(f.cfg.Bootstrap)
	if err != nil {
		return nil, fmt.Errorf("bootstrap policy: %w", err)
	}
	f.publish(Info{Version: p.Version(), Hash: p.Hash(), File: f.cfg.Bootstrap, Source: SourceBootstrap, Status: StatusOK})
	return policy.NewWithOverrides(p, nil, nil), nil
}

// fromState is the snapshot of st as the policy in force (nil when st has
// no document yet) and its Info, to publish once it is in force (with its
// digest, computed then: it walks every override).
func (f *Follower) fromState(st *State, source string) (enforcement.Policy, Info) {
	snap := st.Snapshot(nil)
	if snap == nil {
		return nil, Info{}
	}
	_, rec := st.Document()
	return snap, Info{Version: snap.Version(), Hash: snap.Hash(), Revision: st.Head(), Source: source, Overrides: st.Overrides(), Author: rec.Author,
		Rollout: RolloutInfoOf(st), Epoch: st.Epoch(), Status: StatusOK}
}

// held is the policy in force when the log read may not be the one it
// came from: the log started over under a running follower (startedOver),
// or a follower starts from a cache ahead of the log.
type held struct {
	revision, epoch int64
	startedOver     bool
}

// accepts reports whether st, the state of a log read from its start,
// may replace the policy in force h (see epoch.go): nothing was held; or
// st restores at least h's revision under a newer epoch; or, when the log
// is not known to be another one, it is the same epoch at or past h.
func (h held) accepts(st *State) bool {
	switch {
	case h.revision == 0:
		return true
	case st.Head() < h.revision:
		return false
	case st.Epoch() > h.epoch:
		return true
	default:
		return st.Epoch() == h.epoch && !h.startedOver
	}
}

// staleReason is /readyz's reason while st may not replace h.
func (h held) staleReason(st *State) string {
	return fmt.Sprintf("the policy log holds revision %d (epoch %d), not a restore of revision %d (epoch %d) in force here: "+
		"the log was lost or replaced; this limiter keeps enforcing revision %d until `limiter policy restore` writes a new epoch",
		st.Head(), st.Epoch(), h.revision, h.epoch, h.revision)
}

// setStatus sets /readyz's policy.status and logError (Run is its only
// writer after Start).
func (f *Follower) setStatus(status, msg string) {
	info := f.published()
	info.Status, info.LogError = status, msg
	f.publish(info)
}

func (f *Follower) publish(info Info) {
	info.Signed = f.cfg.Keys != nil
	f.info.Store(&info)
	f.rev.Store(info.Revision)
	f.cfg.Metrics.Set(info)
}

// ReadRetry is how long Run waits after a failed read before the next.
const ReadRetry = time.Second

// MissingTopicRetry is how long Run waits when the topic does not exist
// yet: a fleet started before its first push applies that push within a
// second (docs/policy-log.md), so it looks again several times a second
// (a metadata request each time, while no writer has made the log), and
// the log answers from fresh metadata (kafkalog renews its client when
// it finds the topic missing).
const MissingTopicRetry = 200 * time.Millisecond

// Run follows the log until ctx ends. After each read that reaches the end
// of the log, a new revision (or the first one read after an unreachable
// start) is swapped in and written to the cache. Failed reads are counted
// and retried every ReadRetry (a missing topic every MissingTopicRetry);
// the policy in force stays.
func (f *Follower) Run(ctx context.Context) error {
	f.syncRollout() // a rollout open at start
	failing := false
	for ctx.Err() == nil {
		caughtUp, err := f.client.Poll(ctx)
		if errors.Is(err, ErrStartedOver) {
			// The client forgot the old log; the policy in force stays
			// until the new one restores it under a new epoch (epoch.go).
			cur := f.published()
			if f.held == nil && cur.Source != SourceBootstrap {
				f.held = &held{revision: cur.Revision, epoch: cur.Epoch}
			}
			if f.held != nil {
				f.held.startedOver = true
			}
			f.cfg.Logger.Warn("policy log started over (a broker that kept nothing, a topic recreated): reading the new log from its start; "+
				"the revision in force stays until the new log restores it under a new epoch", "err", err, "revision", cur.Revision, "epoch", cur.Epoch)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			f.cfg.Metrics.errors.Inc()
			if !failing {
				f.cfg.Logger.Warn("policy log: read failed; the policy in force stays, retrying", "err", err)
				f.setStatus(StatusFailing, fmt.Sprintf("cannot read the policy log since %s (the revision in force stays): %v", time.Now().UTC().Format(time.RFC3339), err))
			}
			failing = true
			wait := ReadRetry
			if errors.Is(err, ErrNoTopic) {
				wait = MissingTopicRetry
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		if failing {
			f.cfg.Logger.Info("policy log: reading again")
			f.setStatus(StatusOK, "")
			failing = false
		}
		cur := f.published()
		st := f.client.State()
		if !caughtUp {
			continue
		}
		if time.Since(f.checked) >= f.cfg.CheckEvery {
			f.checkIntegrity(ctx)
		}
		if f.held != nil {
			if !f.held.accepts(st) {
				if why := f.held.staleReason(st); cur.Status != StatusStale || cur.LogError != why {
					f.setStatus(StatusStale, why)
					f.cfg.Logger.Error("policy log: "+why, "topic", f.cfg.Topic)
				}
				continue
			}
			f.held = nil
			cur.Source = "" // replaced even at an equal revision
		}
		if st.Head() == 0 || (st.Head() == cur.Revision && st.Epoch() == cur.Epoch && cur.Source == SourceKafka && cur.Status == StatusOK) {
			continue
		}
		p, info := f.fromState(st, SourceKafka)
		if p == nil {
			continue
		}
		f.Target.SetPolicy(p)
		info.Digest = st.Digest()
		f.publish(info)
		f.syncRollout()
		f.cfg.Logger.Info("policy revision applied", "revision", st.Head(), "epoch", st.Epoch(), "hash", f.Current().Hash, "digest", f.Current().Digest,
			"overrides", st.Overrides(), "previous", cur.Revision, "previous_source", cur.Source)
		if f.Missing != nil {
			if m := f.Missing(p); len(m) > 0 {
				f.cfg.Logger.Warn("the policy in force routes keys to stores REDIS_STORES does not name: those keys decide degraded here", "stores", m, "revision", st.Head())
			}
		}
		f.writeCache()
	}
	f.Close()
	return nil
}

// syncRollout gives the shadow evaluator the open rollout's candidate
// (again at every revision: the overrides may have changed), or ends the
// rollout's shadow. Run is its only caller after start.
func (f *Follower) syncRollout() {
	if f.Shadow == nil {
		return
	}
	st := f.client.State()
	ro, ok := st.Rollout()
	if !ok {
		if f.rolloutRev != 0 {
			f.Shadow.SetRollout(nil, 0)
			f.cfg.Logger.Info("rollout closed: its candidate is no longer evaluated in shadow", "rollout", f.rolloutRev, "revision", st.Head())
		}
		f.rolloutRev = 0
		return
	}
	f.Shadow.SetRollout(st.CandidateSnapshot(nil), ro.Record.Revision)
	if f.rolloutRev != ro.Record.Revision {
		f.cfg.Logger.Info("rollout open: every decision is also evaluated under its candidate (reported, never enforced)",
			"rollout", ro.Record.Revision, "ends_at", ro.Record.Rollout.EndsAt, "author", ro.Record.Author)
	}
	f.rolloutRev = ro.Record.Revision
}
