package main

// The limiter in log mode (POLICY_SOURCE=kafka) tails the policy log: one
// goroutine (policyTail.Run) owns the policylog.Client and is the only
// writer of the state; each revision it reaches at the end of what the log
// holds becomes one immutable policy, swapped into the limiter with one
// atomic store (Limiter.SetPolicy), between decisions. /readyz and the
// metrics read atomics.

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
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
)

// Policy sources, the values of /readyz's policy.source and of the
// limiter_policy_source gauge's label.
const (
	sourceFile      = "file"      // POLICY_SOURCE=file
	sourceKafka     = "kafka"     // the policy log, read to its end
	sourceCache     = "cache"     // the last revision applied, from POLICY_CACHE_DIR (the log unreachable)
	sourceBootstrap = "bootstrap" // POLICY_FILE: the log empty, or unreachable with no cache
)

// policyLogConfig is POLICY_SOURCE and what log mode reads.
type policyLogConfig struct {
	Source    string        // file | kafka
	Topic     string        // POLICY_TOPIC
	CacheDir  string        // POLICY_CACHE_DIR; empty = no cache
	StartWait time.Duration // POLICY_START_WAIT: how long start waits for the log
}

func policyLogConfigFrom(e *envconfig.Reader, brokers []string) policyLogConfig {
	c := policyLogConfig{
		Source:    e.String("POLICY_SOURCE", sourceFile),
		Topic:     e.String("POLICY_TOPIC", kafkalog.DefaultTopic),
		CacheDir:  e.String("POLICY_CACHE_DIR", ""),
		StartWait: e.Duration("POLICY_START_WAIT", 10*time.Second, 100*time.Millisecond, 10*time.Minute),
	}
	switch c.Source {
	case sourceFile:
	case sourceKafka:
		if len(brokers) == 0 {
			e.Fail("POLICY_SOURCE", "kafka needs KAFKA_BROKERS")
		}
	default:
		e.Fail("POLICY_SOURCE", "%q is not file or kafka", c.Source)
	}
	return c
}

// policyMetrics say which revision is in force and where it came from:
// limiter_policy_revision, limiter_policy_source{source} (1 for the one in
// force) and, in log mode, limiter_policy_log_records_total{result,code}.
type policyMetrics struct {
	revision prometheus.Gauge
	source   *prometheus.GaugeVec
	records  *prometheus.CounterVec
	errors   prometheus.Counter
}

func newPolicyMetrics(reg prometheus.Registerer) *policyMetrics {
	m := &policyMetrics{
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
			Help: "Records of the policy log read, by result (applied, refused, ignored) and refusal code (conflict, invalid, garbled).",
		}, []string{"result", "code"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiter_policy_log_errors_total",
			Help: "Failed reads of the policy log (Kafka unreachable, refused); retried every second.",
		}),
	}
	for _, s := range []string{sourceFile, sourceKafka, sourceCache, sourceBootstrap} {
		m.source.WithLabelValues(s)
	}
	m.records.WithLabelValues(policylog.Applied, "")
	for _, c := range []string{policylog.CodeConflict, policylog.CodeInvalid, policylog.CodeGarbled} {
		m.records.WithLabelValues(policylog.Refused, c)
	}
	reg.MustRegister(m.revision, m.source, m.records, m.errors)
	return m
}

func (m *policyMetrics) set(info policyInfo) {
	m.revision.Set(float64(info.Revision))
	for _, s := range []string{sourceFile, sourceKafka, sourceCache, sourceBootstrap} {
		v := 0.0
		if s == info.Source {
			v = 1
		}
		m.source.WithLabelValues(s).Set(v)
	}
}

// policyTail is the limiter's reader of the policy log.
type policyTail struct {
	cfg     policyLogConfig
	file    string // POLICY_FILE, the bootstrap
	log     *kafkalog.Log
	client  *policylog.Client
	target  interface{ SetPolicy(enforcement.Policy) }
	metrics *policyMetrics
	logger  *slog.Logger
	info    atomic.Pointer[policyInfo]
	rev     atomic.Int64
	// shadow follows the open rollout (rollout.go); rolloutRev is the one
	// it was given (0 = none). Set before Run.
	shadow     rolloutTarget
	rolloutRev int64
	// missing lists the stores a policy routes keys to that this limiter
	// lacks (stores.go); nil = not checked.
	missing func(enforcement.Policy) []string
}

func newPolicyTail(cfg config, reg prometheus.Registerer, logger *slog.Logger) (*policyTail, error) {
	l, err := kafkalog.New(kafkalog.Config{
		Brokers: cfg.KafkaBrokers, Topic: cfg.PolicyLog.Topic, Security: cfg.Kafka, ClientID: "limiter-policy",
		Timeout: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	t := &policyTail{cfg: cfg.PolicyLog, file: cfg.PolicyFile, log: l, metrics: newPolicyMetrics(reg), logger: logger}
	t.client = t.newClient()
	return t, nil
}

func (t *policyTail) newClient() *policylog.Client {
	// Records are not kept: a limiter holds only what resolution needs
	// (the cache is written from the compiled overrides).
	c := policylog.NewClient(t.log, false)
	c.OnApply = func(e policylog.Entry, o policylog.Outcome) {
		t.metrics.records.WithLabelValues(o.Result, o.Code).Inc()
		if o.Result == policylog.Refused {
			t.logger.Warn("policy log: record refused", "offset", e.Offset, "log_key", e.Key, "code", o.Code,
				"reason", o.Reason, "revision", o.Record.Revision, "author", o.Record.Author)
		}
	}
	return c
}

// current is the policy in force, for /readyz.
func (t *policyTail) current() policyInfo { return *t.info.Load() }

// revision is the revision in force (decision events carry it).
func (t *policyTail) revision() int64 { return t.rev.Load() }

// start reads the log to its end, within POLICY_START_WAIT, and returns
// the policy to start with: the log's, else the cache's, else the
// bootstrap file's. It fails only when none of them can be read.
func (t *policyTail) start(ctx context.Context) (enforcement.Policy, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.StartWait)
	defer cancel()
	err := t.log.Ensure(ctx)
	if err == nil {
		err = t.client.Sync(ctx)
	}
	for err != nil && ctx.Err() == nil {
		t.metrics.errors.Inc()
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
			if err = t.log.Ensure(ctx); err == nil {
				err = t.client.Sync(ctx)
			}
		}
	}
	if err == nil {
		if p := t.fromState(t.client.State(), sourceKafka); p != nil {
			t.writeCache()
			return p, nil
		}
		t.logger.Warn("policy log is empty: enforcing the bootstrap POLICY_FILE until a document is pushed", "file", t.file)
		return t.bootstrap()
	}
	t.metrics.errors.Inc()
	t.client = t.newClient() // what was read of an unfinished start is read again
	t.logger.Error("policy log unreachable at start; starting from the last revision applied, else POLICY_FILE",
		"topic", t.cfg.Topic, "err", err, "cache_dir", t.cfg.CacheDir)
	if snap, info, err := t.readCache(); err == nil {
		t.publish(info)
		return snap, nil
	} else if t.cfg.CacheDir != "" {
		t.logger.Warn("no usable policy cache", "err", err)
	}
	return t.bootstrap()
}

func (t *policyTail) bootstrap() (enforcement.Policy, error) {
	p, err := policy.Load(t.file)
	if err != nil {
		return nil, fmt.Errorf("bootstrap policy: %w", err)
	}
	t.publish(policyInfo{Version: p.Version(), Hash: p.Hash(), File: t.file, Source: sourceBootstrap})
	return policy.NewWithOverrides(p, nil, nil), nil
}

// fromState is the snapshot of st as the policy in force (nil when st has
// no document yet).
func (t *policyTail) fromState(st *policylog.State, source string) enforcement.Policy {
	snap := st.Snapshot(nil)
	if snap == nil {
		return nil
	}
	_, rec := st.Document()
	t.publish(policyInfo{Version: snap.Version(), Hash: snap.Hash(), Revision: st.Head(), Source: source, Overrides: st.Overrides(), Author: rec.Author,
		Rollout: rolloutInfoOf(st)})
	return snap
}

// setLogError sets /readyz's policy.logError (Run is its only writer).
func (t *policyTail) setLogError(msg string) {
	info := t.current()
	info.LogError = msg
	t.info.Store(&info)
}

func (t *policyTail) publish(info policyInfo) {
	t.info.Store(&info)
	t.rev.Store(info.Revision)
	t.metrics.set(info)
}

// Run follows the log until ctx ends. After each read that reaches the end
// of the log, a new revision (or the first one read after an unreachable
// start) is swapped in and written to the cache. Failed reads are counted
// and retried every second; the policy in force stays.
func (t *policyTail) Run(ctx context.Context) error {
	t.syncRollout() // a rollout open at start
	failing, restarted := false, false
	for ctx.Err() == nil {
		caughtUp, err := t.client.Poll(ctx)
		if errors.Is(err, policylog.ErrStartedOver) {
			// The client forgot the old log; the policy in force stays
			// until the new one is read to its end, then is replaced by
			// the new log's even at an equal revision.
			t.logger.Warn("policy log started over (a broker that kept nothing, a topic recreated): reading the new log from its start", "err", err)
			restarted = true
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.metrics.errors.Inc()
			if !failing {
				t.logger.Warn("policy log: read failed; the policy in force stays, retrying", "err", err)
				t.setLogError(fmt.Sprintf("cannot read the policy log since %s (the revision in force stays): %v", time.Now().UTC().Format(time.RFC3339), err))
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if failing {
			t.logger.Info("policy log: reading again")
			t.setLogError("")
			failing = false
		}
		cur := t.current()
		st := t.client.State()
		if !caughtUp || st.Head() == 0 || (st.Head() == cur.Revision && cur.Source == sourceKafka && !restarted) {
			continue
		}
		p := t.fromState(st, sourceKafka)
		if p == nil {
			continue
		}
		restarted = false
		t.target.SetPolicy(p)
		t.syncRollout()
		t.logger.Info("policy revision applied", "revision", st.Head(), "hash", t.current().Hash, "overrides", st.Overrides(), "previous", cur.Revision, "previous_source", cur.Source)
		if t.missing != nil {
			if m := t.missing(p); len(m) > 0 {
				t.logger.Warn("the policy in force routes keys to stores REDIS_STORES does not name: those keys decide degraded here", "stores", m, "revision", st.Head())
			}
		}
		t.writeCache()
	}
	t.log.Close()
	return nil
}

// cacheFile is the cache's file name in POLICY_CACHE_DIR.
const cacheFile = "policy-log-cache.json"

type cacheBody struct {
	Topic     string           `json:"topic"`
	Head      int64            `json:"head"`
	Document  policylog.Record `json:"document"`
	Overrides []cachedOverride `json:"overrides"`
}

type cachedOverride struct {
	Key      string          `json:"key"`
	Scope    string          `json:"scope,omitempty"`
	Override policy.Override `json:"override"`
}

// writeCache writes the policy in force (the document's record and the
// compiled overrides) to POLICY_CACHE_DIR, atomically: a temporary file,
// synced, then renamed.
func (t *policyTail) writeCache() {
	if t.cfg.CacheDir == "" {
		return
	}
	st := t.client.State()
	_, doc := st.Document()
	body := cacheBody{Topic: t.cfg.Topic, Head: st.Head(), Document: doc, Overrides: make([]cachedOverride, 0, st.Overrides())}
	st.EachOverride(func(k policy.OverrideKey, o policy.Override) {
		o.Reason = "cached"
		body.Overrides = append(body.Overrides, cachedOverride{Key: k.Key, Scope: k.Scope, Override: o})
	})
	b, err := json.Marshal(body)
	if err == nil {
		err = writeFileAtomic(filepath.Join(t.cfg.CacheDir, cacheFile), b)
	}
	if err != nil {
		t.logger.Error("policy cache: cannot write; a start while the log is unreachable will use POLICY_FILE", "dir", t.cfg.CacheDir, "err", err)
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

// readCache rebuilds the policy in force from the cache file: the
// document (its hash checked) and every override (validated against it).
func (t *policyTail) readCache() (*policy.WithOverrides, policyInfo, error) {
	if t.cfg.CacheDir == "" {
		return nil, policyInfo{}, errors.New("POLICY_CACHE_DIR is not set")
	}
	b, err := os.ReadFile(filepath.Join(t.cfg.CacheDir, cacheFile))
	if err != nil {
		return nil, policyInfo{}, err
	}
	var c cacheBody
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, policyInfo{}, fmt.Errorf("policy cache: %w", err)
	}
	if c.Topic != t.cfg.Topic {
		return nil, policyInfo{}, fmt.Errorf("policy cache is of topic %q, not %q", c.Topic, t.cfg.Topic)
	}
	v, err := c.Document.Encode()
	if err != nil {
		return nil, policyInfo{}, err
	}
	if _, err := policylog.Decode(policylog.DocumentKey, v); err != nil || c.Head < 1 {
		return nil, policyInfo{}, fmt.Errorf("policy cache: the document: %v (head %d)", err, c.Head)
	}
	doc, err := policy.Parse([]byte(c.Document.Document))
	if err != nil {
		return nil, policyInfo{}, fmt.Errorf("policy cache: the document: %w", err)
	}
	ov := policy.NewOverrides(len(c.Overrides))
	for _, o := range c.Overrides {
		if err := o.Override.Validate(doc); err != nil {
			return nil, policyInfo{}, fmt.Errorf("policy cache: override of %q: %w", o.Key, err)
		}
		ov.Put(policy.OverrideKey{Key: o.Key, Scope: o.Scope}, o.Override)
	}
	info := policyInfo{Version: doc.Version(), Hash: doc.Hash(), Revision: c.Head, Source: sourceCache, Overrides: ov.Len(), Author: c.Document.Author}
	return policy.NewWithOverrides(doc, ov, nil), info, nil
}

// loadPolicy is the policy to start with, by POLICY_SOURCE: the file
// (doc is then the file, tail nil), or the policy log (tail set).
func loadPolicy(ctx context.Context, cfg config, reg prometheus.Registerer, log *slog.Logger) (pol enforcement.Policy, doc *policy.Policy, tail *policyTail, err error) {
	if cfg.PolicyLog.Source != sourceKafka {
		p, err := policy.Load(cfg.PolicyFile)
		if err != nil {
			return nil, nil, nil, err
		}
		newPolicyMetrics(reg).set(policyInfo{Source: sourceFile})
		return p, p, nil, nil
	}
	tail, err = newPolicyTail(cfg, reg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	pol, err = tail.start(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	log.Info("policy from the policy log", "topic", cfg.PolicyLog.Topic, "source", tail.current().Source,
		"revision", tail.current().Revision, "hash", tail.current().Hash)
	return pol, pol.(*policy.WithOverrides).Policy, tail, nil
}
