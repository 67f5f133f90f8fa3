// Package reconcile restores enforcement from accounting: every interval it
// raises each quota counter in Redis to at least the allowed cost that the
// ClickHouse rollups record for the counter's current window, so that after
// Redis loses state (restart without persistence, failover to a replica that
// was behind, eviction) a customer's quota is back to its true value within
// one interval plus the metering lag, instead of starting the period again.
//
// It runs in cmd/meter-consumer, off the request path: the limiter never
// waits for it, and it never lowers a counter (the limiter is the only writer
// that counts down to a rejection). Usage is attributed to quota counters by
// package quotause, with the limiter's own policy resolution.
package reconcile

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/policy"
)

//go:embed raise.lua
var raiseLua string

var raiseScript = redis.NewScript(raiseLua)

// Rows reads the recorded usage of the month that contains now
// (*quotause.Reader); key "" means every key.
type Rows interface {
	Rows(ctx context.Context, now time.Time, key string) ([]quotause.Row, error)
}

// RegionRows reads the usage one region's limiters decided
// (*quotause.Reader).
type RegionRows interface {
	RegionRows(ctx context.Context, now time.Time, key, region string) ([]quotause.Row, error)
}

// DefaultEvery is the time between passes (METER_RECONCILE_EVERY).
const DefaultEvery = 30 * time.Second

// Config configures a Reconciler. Zero values of optional fields are
// documented.
type Config struct {
	Redis     redis.UniversalClient // required: standalone, Sentinel or Cluster
	KeyPrefix string                // REDIS_KEY_PREFIX of the limiters; "" = limits.DefaultKeyPrefix
	Rows      Rows                  // required
	// Region is the region whose store Redis is (METER_RECONCILE_REGION):
	// a counter of a regional limit there is raised to that region's usage
	// only. "" = one region: every counter in Redis, to all the usage
	// recorded. With a region, Rows must also be a RegionRows
	// (*quotause.Reader is).
	Region string
	// GlobalRedis is the home region's Redis (GLOBAL_REDIS_*), where the
	// counter of a global limit's quota is kept, under GlobalKeyPrefix
	// + ":g" as enforcement/global keeps it; it is raised to every
	// region's usage. nil (with a Region) = global quotas are left to a
	// reconciler that has the home. Ignored without a Region.
	GlobalRedis     redis.UniversalClient
	GlobalKeyPrefix string // GLOBAL_REDIS_KEY_PREFIX; "" = limits.DefaultKeyPrefix
	// Policy returns the policy in force (the limiter's file, re-read when
	// it changes: *policy.Current's Get). Required.
	Policy func() (*policy.Policy, error)

	Every        time.Duration // between passes; 0 = DefaultEvery
	ReadTimeout  time.Duration // bound on the ClickHouse read of one pass; 0 = 20 s
	RedisTimeout time.Duration // bound on one key's script call; 0 = 2 s
	Workers      int           // keys raised concurrently; 0 = 8
	// FailedPassesUnready: Ready reports false after this many failed
	// passes in a row; 0 = 3.
	FailedPassesUnready int
	Now                 func() time.Time // nil = time.Now (tests control the clock)
	Logger              *slog.Logger     // nil = discard
	Registry            prometheus.Registerer
}

// Reconciler raises quota counters. Run is its one goroutine, owned by the
// caller; Pass is one round, for tests and tools.
type Reconciler struct {
	cfg Config
	log *slog.Logger

	reconciled *prometheus.CounterVec // counters examined, by result
	raised     prometheus.Gauge       // counters raised by the last pass
	largest    prometheus.Gauge       // largest raise of the last pass, tokens
	errs       *prometheus.CounterVec // failures by stage
	passes     *prometheus.CounterVec // passes by result
	lastOK     prometheus.Gauge
	duration   prometheus.Histogram

	failedInRow atomic.Int64
	lastErr     atomic.Pointer[string]
}

// Metrics are the reconciler's collectors (for tests and dashboards).
type Metrics struct {
	Reconciled *prometheus.CounterVec // meter_quota_reconciled_total{result}
	Raised     prometheus.Gauge       // meter_quota_keys_raised
	Largest    prometheus.Gauge       // meter_quota_largest_correction
	Errors     *prometheus.CounterVec // meter_quota_reconcile_errors_total{stage}
	Passes     *prometheus.CounterVec // meter_quota_reconcile_passes_total{result}
}

// Metrics returns the reconciler's collectors.
func (r *Reconciler) Metrics() Metrics {
	return Metrics{Reconciled: r.reconciled, Raised: r.raised, Largest: r.largest, Errors: r.errs, Passes: r.passes}
}

// New checks cfg and registers the metrics.
func New(cfg Config) (*Reconciler, error) {
	var errs []error
	if cfg.Redis == nil {
		errs = append(errs, errors.New("reconcile: Config.Redis is required"))
	}
	if cfg.Rows == nil {
		errs = append(errs, errors.New("reconcile: Config.Rows is required"))
	}
	if cfg.Policy == nil {
		errs = append(errs, errors.New("reconcile: Config.Policy is required"))
	}
	if _, ok := cfg.Rows.(RegionRows); cfg.Region != "" && cfg.Rows != nil && !ok {
		errs = append(errs, errors.New("reconcile: Config.Rows must read per region (RegionRows) when Config.Region is set"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.GlobalKeyPrefix == "" {
		cfg.GlobalKeyPrefix = limits.DefaultKeyPrefix
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 20 * time.Second
	}
	if cfg.RedisTimeout <= 0 {
		cfg.RedisTimeout = 2 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.FailedPassesUnready <= 0 {
		cfg.FailedPassesUnready = 3
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	r := &Reconciler{cfg: cfg, log: cfg.Logger}
	r.reconciled = promdecl.CounterVec("meter_quota_reconciled_total", "Quota counters compared with the usage record, by result: raised (Redis was behind), unchanged (at or ahead of the record), error (the Redis call failed).", "result")
	r.raised = promdecl.Gauge("meter_quota_keys_raised", "Quota counters raised by the last completed reconcile pass (non-zero after Redis lost state).")
	r.largest = promdecl.Gauge("meter_quota_largest_correction", "Largest raise of one quota counter in the last completed reconcile pass, in tokens.")
	r.errs = promdecl.CounterVec("meter_quota_reconcile_errors_total", "Reconcile failures by stage: policy, clickhouse (the pass is retried), redis (one key; the others go on).", "stage")
	r.passes = promdecl.CounterVec("meter_quota_reconcile_passes_total", "Reconcile passes by result (ok, failed).", "result")
	r.lastOK = promdecl.Gauge("meter_quota_reconcile_last_success_timestamp_seconds", "When the last reconcile pass completed without an error.")
	r.duration = promdecl.Histogram("meter_quota_reconcile_duration_seconds", "Duration of one reconcile pass.", prometheus.ExponentialBuckets(0.005, 2, 14))
	for _, c := range []prometheus.Collector{r.reconciled, r.raised, r.largest, r.errs, r.passes, r.lastOK, r.duration} {
		if err := cfg.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("reconcile: register metrics: %w", err)
		}
	}
	for _, res := range []string{"raised", "unchanged", "error"} {
		r.reconciled.WithLabelValues(res)
	}
	for _, st := range []string{"policy", "clickhouse", "redis"} {
		r.errs.WithLabelValues(st)
	}
	for _, res := range []string{"ok", "failed"} {
		r.passes.WithLabelValues(res)
	}
	return r, nil
}

// Run reconciles at once, then every Config.Every, until ctx ends; a failed
// pass is retried sooner (1 s doubling, at most Every). It returns nil when
// ctx ends: failures are counted and logged, never fatal.
func (r *Reconciler) Run(ctx context.Context) error {
	backoff := time.Second
	for {
		wait := r.cfg.Every
		if _, err := r.Pass(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			wait = min(backoff, r.cfg.Every)
			backoff = min(2*backoff, r.cfg.Every)
		} else {
			backoff = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Ready reports false, with the last error, after Config.FailedPassesUnready
// failed passes in a row: quotas are then not being restored.
func (r *Reconciler) Ready() (bool, string) {
	n := r.failedInRow.Load()
	if n < int64(r.cfg.FailedPassesUnready) {
		return true, ""
	}
	why := "unknown error"
	if p := r.lastErr.Load(); p != nil {
		why = *p
	}
	return false, fmt.Sprintf("quota reconciliation failed %d times in a row: %s", n, why)
}

// Result is what one pass did.
type Result struct {
	Counters   int   // quota counters compared
	Raised     int   // of which raised
	Largest    int64 // largest raise, tokens
	Failed     int   // Redis calls (keys) that failed
	NoQuotaRow int   // recorded (key, scope, tier) rows that no quota counts
}

// Pass reconciles once, at Config.Now: reads the month's rollups, attributes
// them to quota counters through the current policy, and raises every
// counter that is behind, one atomic script call per rate-limit key.
func (r *Reconciler) Pass(ctx context.Context) (Result, error) {
	start := time.Now()
	res, err := r.pass(ctx)
	r.duration.Observe(time.Since(start).Seconds())
	if err != nil && ctx.Err() != nil {
		return res, err // stopped by its owner (shutdown): not a failure
	}
	if err != nil {
		msg := err.Error()
		r.lastErr.Store(&msg)
		r.failedInRow.Add(1)
		r.passes.WithLabelValues("failed").Inc()
		r.log.Warn("quota reconcile pass failed; retrying", "err", err, "failed_in_row", r.failedInRow.Load())
		return res, err
	}
	r.failedInRow.Store(0)
	r.passes.WithLabelValues("ok").Inc()
	r.lastOK.SetToCurrentTime()
	return res, nil
}

func (r *Reconciler) pass(ctx context.Context) (Result, error) {
	var res Result
	pol, err := r.cfg.Policy()
	if err != nil {
		r.errs.WithLabelValues("policy").Inc()
		return res, fmt.Errorf("reconcile: policy: %w", err)
	}
	if !pol.HasQuotas() {
		r.raised.Set(0)
		r.largest.Set(0)
		return res, nil // nothing to restore, and no reason to read ClickHouse
	}
	now := r.cfg.Now()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	rows, err := r.cfg.Rows.Rows(rctx, now, "")
	if err == nil && r.cfg.Region != "" {
		var mine []quotause.Row
		mine, err = r.cfg.Rows.(RegionRows).RegionRows(rctx, now, "", r.cfg.Region)
		rows = quotause.InRegion(pol, rows, mine)
	}
	cancel()
	if err != nil {
		r.errs.WithLabelValues("clickhouse").Inc()
		return res, fmt.Errorf("reconcile: %w", err)
	}
	all, skipped := quotause.Attribute(pol, rows, now)
	res.NoQuotaRow = skipped.NoQuota + skipped.UnknownTier
	// A counter with nothing recorded (say, only dry-run spend) can never be
	// raised: no call for it.
	quotas := all[:0]
	for _, q := range all {
		if q.Used > 0 && (!q.Global || r.cfg.Region == "" || r.cfg.GlobalRedis != nil) {
			quotas = append(quotas, q)
		}
	}

	// One script call per rate-limit key: its counters share a hash tag.
	var groups [][]quotause.Quota
	for i := 0; i < len(quotas); {
		j := i + 1
		for j < len(quotas) && quotas[j].Key == quotas[i].Key && r.atHome(quotas[j]) == r.atHome(quotas[i]) {
			j++
		}
		groups = append(groups, quotas[i:j])
		i = j
	}

	var (
		mu       sync.Mutex
		firstErr error
		logged   int
	)
	work := make(chan []quotause.Quota)
	var wg sync.WaitGroup
	for range min(r.cfg.Workers, max(1, len(groups))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range work {
				out, err := r.raise(ctx, g)
				mu.Lock()
				res.Counters += len(g)
				if err != nil {
					res.Failed++
					r.errs.WithLabelValues("redis").Inc()
					r.reconciled.WithLabelValues("error").Add(float64(len(g)))
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				for i, o := range out {
					if !o.raised {
						r.reconciled.WithLabelValues("unchanged").Inc()
						continue
					}
					r.reconciled.WithLabelValues("raised").Inc()
					res.Raised++
					delta := int64(g[i].Used) - o.before
					res.Largest = max(res.Largest, delta)
					// Every raise is an incident (Redis lost a counter); a
					// mass loss logs the first 20 of a pass and the summary.
					if logged < 20 {
						logged++
						r.log.Info("quota counter raised to the usage record", "key", g[i].Key, "quota_id", g[i].QuotaID,
							"window_start", g[i].Start, "from", o.before, "to", g[i].Used, "limit", g[i].Limit)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, g := range groups {
		if ctx.Err() != nil {
			break
		}
		work <- g
	}
	close(work)
	wg.Wait()

	r.raised.Set(float64(res.Raised))
	r.largest.Set(float64(res.Largest))
	if res.Raised > 0 || res.Failed > 0 {
		r.log.Info("quota reconcile pass", "counters", res.Counters, "raised", res.Raised, "largest_correction", res.Largest,
			"failed_keys", res.Failed, "rows_without_quota", res.NoQuotaRow)
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("reconcile: %w", ctx.Err())
	}
	if firstErr != nil {
		return res, fmt.Errorf("reconcile: %d of %d keys failed, first: %w", res.Failed, len(groups), firstErr)
	}
	return res, nil
}

type raiseOutcome struct {
	before int64
	raised bool
}

// atHome: q's counter is the home's (a global quota across regions).
func (r *Reconciler) atHome(q quotause.Quota) bool { return q.Global && r.cfg.Region != "" }

// raise runs the script for the counters of one key, all in one store (the
// region's, or the home's: atHome), under its own deadline.
func (r *Reconciler) raise(ctx context.Context, g []quotause.Quota) ([]raiseOutcome, error) {
	keys := make([]string, len(g))
	args := make([]any, 0, 2*len(g))
	rdb, prefix := r.cfg.Redis, r.cfg.KeyPrefix
	if r.atHome(g[0]) {
		rdb, prefix = r.cfg.GlobalRedis, r.cfg.GlobalKeyPrefix+":g"
	}
	for i, q := range g {
		keys[i] = q.RedisKey(prefix)
		args = append(args, strconv.FormatUint(q.Used, 10), strconv.FormatInt(limitsExpiry(q), 10))
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.RedisTimeout)
	defer cancel()
	vals, err := raiseScript.Run(cctx, rdb, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("raise quota counters of key %q: %w", g[0].Key, err)
	}
	if len(vals) != 2*len(g) {
		return nil, fmt.Errorf("raise quota counters of key %q: %d values for %d counters", g[0].Key, len(vals), len(g))
	}
	out := make([]raiseOutcome, len(g))
	for i := range g {
		out[i] = raiseOutcome{before: vals[2*i], raised: vals[2*i+1] == 1}
	}
	return out, nil
}

// limitsExpiry is the counter's expiry in ms: the bucket script's.
func limitsExpiry(q quotause.Quota) int64 { return limits.QuotaKeyExpiry(q.End).UnixMilli() }
