package policylog

// A Follower is a limiter's reader of the policy log (POLICY_SOURCE=kafka):
// one goroutine (Run) owns the Client and is the only writer of the state;
// each revision it reaches at the end of what the log holds becomes one
// immutable policy, swapped into the target with one call (SetPolicy),
// between decisions. /readyz and the metrics read atomics.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	// LogError: in log mode, why the log cannot be read now (the revision
	// in force stays); empty while it can.
	LogError string `json:"logError,omitempty"`
	// Rollout is the open rollout of the policy log, if any.
	Rollout *RolloutInfo `json:"rollout,omitempty"`
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

// Metrics say which revision is in force and where it came from:
// limiter_policy_revision, limiter_policy_source{source} (1 for the one in
// force) and, in log mode, limiter_policy_log_records_total{result,code}.
type Metrics struct {
	revision prometheus.Gauge
	source   *prometheus.GaugeVec
	records  *prometheus.CounterVec
	errors   prometheus.Counter
}

// NewMetrics registers the metrics of the policy in force on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "limiter_policy_revision",
			Help: "Revision of the policy log in force (0 in file mode, or before the log's first document).",
		}),
		source: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "limiter_policy_source",
			Help: "1 for where the policy in force came from: file, kafka (the log), cache (POLICY_CACHE_DIR: the log unreachable) or bootstrap (POLICY_FILE: the log empty or unreachable).",
		}, []string{"source"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiter_policy_log_records_total",
			Help: "Records of the policy log read, by result (applied, refused, ignored) and refusal code (conflict, invalid, garbled, unauthenticated).",
		}, []string{"result", "code"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiter_policy_log_errors_total",
			Help: "Failed reads of the policy log (Kafka unreachable, refused); retried every second.",
		}),
	}
	for _, s := range []string{SourceFile, SourceKafka, SourceCache, SourceBootstrap} {
		m.source.WithLabelValues(s)
	}
	m.records.WithLabelValues(Applied, "")
	for _, c := range []string{CodeConflict, CodeInvalid, CodeGarbled, CodeUnauthenticated} {
		m.records.WithLabelValues(Refused, c)
	}
	reg.MustRegister(m.revision, m.source, m.records, m.errors)
	return m
}

// Set publishes info as the policy in force.
func (m *Metrics) Set(info Info) {
	m.revision.Set(float64(info.Revision))
	for _, s := range []string{SourceFile, SourceKafka, SourceCache, SourceBootstrap} {
		v := 0.0
		if s == info.Source {
			v = 1
		}
		m.source.WithLabelValues(s).Set(v)
	}
}

// FollowedLog is the log a Follower reads: a Log it makes sure exists
// before reading it, and closes when it stops.
type FollowedLog interface {
	Log
	Ensure(ctx context.Context) error
	Close()
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

	// Target receives each new policy; Shadow, when set, follows the open
	// rollout; Missing, when set, lists the stores a policy routes keys to
	// that this limiter lacks (logged). Set before Run.
	Target  interface{ SetPolicy(enforcement.Policy) }
	Shadow  RolloutTarget
	Missing func(enforcement.Policy) []string

	rolloutRev int64 // the rollout Shadow was given (0 = none)
	// prior is the signature checks of the previous run (checked.go),
	// used by Start only.
	prior *Checked
}

// NewFollower returns a follower that has read nothing yet.
func NewFollower(cfg FollowerConfig) *Follower {
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
			f.cfg.Logger.Warn("policy log: record refused", "offset", e.Offset, "log_key", e.Key, "code", o.Code,
				"reason", o.Reason, "revision", o.Record.Revision, "author", o.Record.Author)
		}
	}
	return c
}

// Current is the policy in force, for /readyz.
func (f *Follower) Current() Info { return *f.info.Load() }

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
	err := f.cfg.Log.Ensure(ctx)
	if err == nil {
		err = f.client.Sync(ctx)
	}
	for err != nil && ctx.Err() == nil {
		f.cfg.Metrics.errors.Inc()
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
			if err = f.cfg.Log.Ensure(ctx); err == nil {
				err = f.client.Sync(ctx)
			}
		}
	}
	if err == nil {
		// What the start checked is all the previous run could vouch for.
		f.prior = nil
		f.client.UseChecked(nil)
		if p := f.fromState(f.client.State(), SourceKafka); p != nil {
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
	f.publish(Info{Version: p.Version(), Hash: p.Hash(), File: f.cfg.Bootstrap, Source: SourceBootstrap})
	return policy.NewWithOverrides(p, nil, nil), nil
}

// fromState is the snapshot of st as the policy in force (nil when st has
// no document yet).
func (f *Follower) fromState(st *State, source string) enforcement.Policy {
	snap := st.Snapshot(nil)
	if snap == nil {
		return nil
	}
	_, rec := st.Document()
	f.publish(Info{Version: snap.Version(), Hash: snap.Hash(), Revision: st.Head(), Source: source, Overrides: st.Overrides(), Author: rec.Author,
		Rollout: RolloutInfoOf(st)})
	return snap
}

// setLogError sets /readyz's policy.logError (Run is its only writer).
func (f *Follower) setLogError(msg string) {
	info := f.Current()
	info.LogError = msg
	f.info.Store(&info)
}

func (f *Follower) publish(info Info) {
	f.info.Store(&info)
	f.rev.Store(info.Revision)
	f.cfg.Metrics.Set(info)
}

// Run follows the log until ctx ends. After each read that reaches the end
// of the log, a new revision (or the first one read after an unreachable
// start) is swapped in and written to the cache. Failed reads are counted
// and retried every second; the policy in force stays.
func (f *Follower) Run(ctx context.Context) error {
	f.syncRollout() // a rollout open at start
	failing, restarted := false, false
	for ctx.Err() == nil {
		caughtUp, err := f.client.Poll(ctx)
		if errors.Is(err, ErrStartedOver) {
			// The client forgot the old log; the policy in force stays
			// until the new one is read to its end, then is replaced by
			// the new log's even at an equal revision.
			f.cfg.Logger.Warn("policy log started over (a broker that kept nothing, a topic recreated): reading the new log from its start", "err", err)
			restarted = true
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			f.cfg.Metrics.errors.Inc()
			if !failing {
				f.cfg.Logger.Warn("policy log: read failed; the policy in force stays, retrying", "err", err)
				f.setLogError(fmt.Sprintf("cannot read the policy log since %s (the revision in force stays): %v", time.Now().UTC().Format(time.RFC3339), err))
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if failing {
			f.cfg.Logger.Info("policy log: reading again")
			f.setLogError("")
			failing = false
		}
		cur := f.Current()
		st := f.client.State()
		if !caughtUp || st.Head() == 0 || (st.Head() == cur.Revision && cur.Source == SourceKafka && !restarted) {
			continue
		}
		p := f.fromState(st, SourceKafka)
		if p == nil {
			continue
		}
		restarted = false
		f.Target.SetPolicy(p)
		f.syncRollout()
		f.cfg.Logger.Info("policy revision applied", "revision", st.Head(), "hash", f.Current().Hash, "overrides", st.Overrides(), "previous", cur.Revision, "previous_source", cur.Source)
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

// CacheFile is the cache's file name in POLICY_CACHE_DIR.
const CacheFile = "policy-log-cache.json"

type cacheBody struct {
	Topic     string           `json:"topic"`
	Head      int64            `json:"head"`
	Document  Record           `json:"document"`
	Overrides []cachedOverride `json:"overrides"`
}

type cachedOverride struct {
	Key      string          `json:"key"`
	Scope    string          `json:"scope,omitempty"`
	Override policy.Override `json:"override"`
}

// writeCache writes the policy in force (the document's record and the
// compiled overrides) to CacheDir, atomically: a temporary file, synced,
// then renamed.
func (f *Follower) writeCache() {
	if f.cfg.CacheDir == "" {
		return
	}
	st := f.client.State()
	_, doc := st.Document()
	body := cacheBody{Topic: f.cfg.Topic, Head: st.Head(), Document: doc, Overrides: make([]cachedOverride, 0, st.Overrides())}
	st.EachOverride(func(k policy.OverrideKey, o policy.Override) {
		o.Reason = "cached"
		body.Overrides = append(body.Overrides, cachedOverride{Key: k.Key, Scope: k.Scope, Override: o})
	})
	b, err := json.Marshal(body)
	if err == nil {
		err = writeFileAtomic(filepath.Join(f.cfg.CacheDir, CacheFile), b)
	}
	if err == nil && f.cfg.Keys != nil {
		err = f.client.Checked().Save(filepath.Join(f.cfg.CacheDir, CheckedFile))
	}
	if err != nil {
		f.cfg.Logger.Error("policy cache: cannot write; a start while the log is unreachable will use POLICY_FILE", "dir", f.cfg.CacheDir, "err", err)
	}
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a rename there is nothing left to remove
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// ReadCache rebuilds the policy in force from the cache file in dir, of
// topic: the document (its hash checked) and every override (validated
// against it).
func ReadCache(dir, topic string) (*policy.WithOverrides, Info, error) {
	if dir == "" {
		return nil, Info{}, errors.New("POLICY_CACHE_DIR is not set")
	}
	b, err := os.ReadFile(filepath.Join(dir, CacheFile))
	if err != nil {
		return nil, Info{}, err
	}
	var c cacheBody
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, Info{}, fmt.Errorf("policy cache: %w", err)
	}
	if c.Topic != topic {
		return nil, Info{}, fmt.Errorf("policy cache is of topic %q, not %q", c.Topic, topic)
	}
	v, err := c.Document.Encode()
	if err != nil {
		return nil, Info{}, err
	}
	if _, err := Decode(DocumentKey, v); err != nil || c.Head < 1 {
		return nil, Info{}, fmt.Errorf("policy cache: the document: %v (head %d)", err, c.Head)
	}
	doc, err := policy.Parse([]byte(c.Document.Document))
	if err != nil {
		return nil, Info{}, fmt.Errorf("policy cache: the document: %w", err)
	}
	ov := policy.NewOverrides(len(c.Overrides))
	for _, o := range c.Overrides {
		if err := o.Override.Validate(doc); err != nil {
			return nil, Info{}, fmt.Errorf("policy cache: override of %q: %w", o.Key, err)
		}
		ov.Put(policy.OverrideKey{Key: o.Key, Scope: o.Scope}, o.Override)
	}
	info := Info{Version: doc.Version(), Hash: doc.Hash(), Revision: c.Head, Source: SourceCache, Overrides: ov.Len(), Author: c.Document.Author}
	return policy.NewWithOverrides(doc, ov, nil), info, nil
}
