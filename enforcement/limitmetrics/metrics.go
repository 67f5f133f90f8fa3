// Package limitmetrics exports what the limiter does as Prometheus metrics.
// The names here are the ones the alert rules (deploy/prometheus/rules/)
// and the Grafana dashboard use.
package limitmetrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/promdecl"
)

// Metrics implements enforcement.Observer and redisstore.Observer. It is safe
// for concurrent use. Label values are bounded: sources and results are
// fixed sets, and policy names come from the policy file.
type Metrics struct {
	decisions      *prometheus.CounterVec
	byPolicy       *prometheus.CounterVec
	latency        prometheus.Histogram
	storeLatency   prometheus.Histogram
	storeErrors    prometheus.Counter
	unavailable    prometheus.Counter
	clockBack      prometheus.Counter
	breaker        *prometheus.GaugeVec
	anonymous      *prometheus.CounterVec
	instances      prometheus.Gauge
	fixed          [2][5]prometheus.Counter // [allowed][source]
	anon           [2]prometheus.Counter    // [allowed]
	policyCounters sync.Map                 // policy name → *[3]prometheus.Counter
}

var (
	_ enforcement.Observer = (*Metrics)(nil)
	_ redisstore.Observer  = (*Metrics)(nil)
)

// New registers the limiter's metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: promdecl.CounterVec("limiter_decisions_total", "Decisions by result (allowed, rejected) and source (local, shared, degraded, regional).", "result", "source"),
		byPolicy:  promdecl.CounterVec("limiter_policy_decisions_total", "Decisions per policy rule: allowed, rejected, and would_reject (dry run: enforcement would have rejected).", "policy", "outcome"),
		// 750 µs, 1.5 ms and 2 ms: the 1 ms objective sits between them,
		// so a p99 near it is read from its neighbours rather than
		// interpolated across 1 ms to 2.5 ms.
		latency: promdecl.Histogram("limiter_decision_duration_seconds", "The limiter's own decision latency, from request to verdict, separate from any endpoint's.",
			[]float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3}),
		storeLatency: promdecl.Histogram("limiter_store_call_duration_seconds", "Latency of calls to the shared store (Redis), failed ones included.", []float64{50e-6, 100e-6, 250e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 5e-3, 10e-3, 25e-3}),
		storeErrors:  promdecl.Counter("limiter_store_errors_total", "Shared store calls that failed (timeouts included)."),
		unavailable:  promdecl.Counter("limiter_shared_unavailable_total", "Decisions for which the shared store could not be asked (store error or breaker open)."),
		clockBack:    promdecl.Counter("limiter_negative_elapsed_total", "Bucket updates that saw the clock step backwards (elapsed clamped to 0; no tokens removed)."),
		breaker:      promdecl.GaugeVec("limiter_breaker_state", "Shared store circuit breaker per shard (\"store\" for a standalone Redis, the master's address in a Cluster): 0 closed, 1 half-open, 2 open.", "shard"),
		anonymous:    promdecl.CounterVec("limiter_anonymous_decisions_total", "Decisions for anonymous traffic (keyed by client address, ip:, or by nothing, anonymous) by result: a rejection ratio near 0% or 100% means the proxy headers are misconfigured.", "result"),
		instances:    promdecl.Gauge("limiter_fleet_instances", "Limiter instances sharing the load, as last counted by the fleet heartbeat (LIMITER_EXPECTED_INSTANCES before the first count): what the local tier, the degraded limits and the quota share divide by."),
	}
	reg.MustRegister(m.decisions, m.byPolicy, m.latency, m.storeLatency, m.storeErrors,
		m.unavailable, m.clockBack, m.breaker, m.anonymous, m.instances)
	for a, result := range []string{"rejected", "allowed"} {
		for _, s := range []enforcement.Source{enforcement.SourceLocal, enforcement.SourceShared, enforcement.SourceDegraded, enforcement.SourceRegional} {
			m.fixed[a][s] = m.decisions.WithLabelValues(result, s.String())
		}
		m.anon[a] = m.anonymous.WithLabelValues(result)
	}
	return m
}

// Decided implements enforcement.Observer.
func (m *Metrics) Decided(req enforcement.Request, d enforcement.Decision, took time.Duration) {
	// Count by what enforcement decided (WouldAllow): a dry-run rejection is
	// still a rejection for the ratio alerts, and is marked would_reject.
	a := 0
	if d.WouldAllow {
		a = 1
	}
	m.fixed[a][d.Source].Inc()
	if enforcement.IsAnonymous(req.Key) {
		m.anon[a].Inc()
	}
	if req.TraceID != ([16]byte{}) {
		observeTraced(m.latency, took.Seconds(), req.TraceID)
	} else {
		m.latency.Observe(took.Seconds())
	}
	pc := m.policy(d.Policy)
	switch {
	case d.WouldAllow:
		pc[0].Inc()
	case d.DryRun:
		pc[2].Inc()
	default:
		pc[1].Inc()
	}
}

func (m *Metrics) policy(name string) *[3]prometheus.Counter {
	if v, ok := m.policyCounters.Load(name); ok {
		return v.(*[3]prometheus.Counter)
	}
	pc := &[3]prometheus.Counter{
		m.byPolicy.WithLabelValues(name, "allowed"),
		m.byPolicy.WithLabelValues(name, "rejected"),
		m.byPolicy.WithLabelValues(name, "would_reject"),
	}
	v, _ := m.policyCounters.LoadOrStore(name, pc)
	return v.(*[3]prometheus.Counter)
}

// Instances sets the fleet size gauge.
func (m *Metrics) Instances(n int) { m.instances.Set(float64(n)) }

// AuthorityFailed implements enforcement.Observer.
func (m *Metrics) AuthorityFailed(error) { m.unavailable.Inc() }

// ClockBack implements enforcement.Observer.
func (m *Metrics) ClockBack() { m.clockBack.Inc() }

// StoreCall implements redisstore.Observer.
func (m *Metrics) StoreCall(took time.Duration, err error) {
	m.storeLatency.Observe(took.Seconds())
	if err != nil {
		m.storeErrors.Inc()
	}
}

// BreakerState implements redisstore.Observer for a standalone store.
func (m *Metrics) BreakerState(s redisstore.State) {
	m.breaker.WithLabelValues("store").Set(float64(s))
}

// ForShard returns the observer of one Cluster shard's guard
// (redisstore.Shared uses it when present).
func (m *Metrics) ForShard(shard string) redisstore.Observer { return shardObserver{m, shard} }

type shardObserver struct {
	*Metrics
	shard string
}

func (o shardObserver) BreakerState(s redisstore.State) {
	o.breaker.WithLabelValues(o.shard).Set(float64(s))
}
