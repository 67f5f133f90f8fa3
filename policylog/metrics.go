package policylog

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/promdecl"
)

// Metrics say which revision is in force and where it came from:
// limiter_policy_revision, limiter_policy_source{source} (1 for the one in
// force) and, in log mode, limiter_policy_log_records_total{result,code}.
type Metrics struct {
	revision prometheus.Gauge
	source   *prometheus.GaugeVec
	records  *prometheus.CounterVec
	errors   prometheus.Counter
	stale    prometheus.Gauge
	unsafe   prometheus.Gauge
	// checkpoints counts the starts that relied on a checkpoint, by
	// result (matched, mismatch).
	checkpoints *prometheus.CounterVec
}

// NewMetrics registers the metrics of the policy in force on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		revision:    promdecl.Gauge("limiter_policy_revision", "Revision of the policy log in force (0 in file mode, or before the log's first document)."),
		source:      promdecl.GaugeVec("limiter_policy_source", "1 for where the policy in force came from: file, kafka (the log), cache (POLICY_CACHE_DIR: the log unreachable) or bootstrap (POLICY_FILE: the log empty or unreachable).", "source"),
		records:     promdecl.CounterVec("limiter_policy_log_records_total", "Records of the policy log read, by result (applied, refused, ignored) and refusal code (conflict, invalid, garbled, unauthenticated).", "result", "code"),
		errors:      promdecl.Counter("limiter_policy_log_errors_total", "Failed reads of the policy log (Kafka unreachable, refused); retried every second."),
		stale:       promdecl.Gauge("limiter_policy_log_stale", "1 while the policy log read is not applied: it started over below the revision in force without a new epoch (a lost log; `limiter policy restore` writes one)."),
		unsafe:      promdecl.Gauge("limiter_policy_log_unsafe", "1 while the policy topic can delete records (cleanup.policy, retention.ms, retention.bytes) or starts after offset 0 without an epoch record to prove the state complete."),
		checkpoints: promdecl.CounterVec("limiter_policy_log_checkpoints_total", "Reads of the policy log from its start that relied on its latest checkpoint, by result: matched (the records below it applied without checking each signature) or mismatch (the state below it is not the one the checkpoint signs: every signature checked instead).", "result"),
	}
	for _, s := range []string{SourceFile, SourceKafka, SourceCache, SourceBootstrap} {
		m.source.WithLabelValues(s)
	}
	m.checkpoints.WithLabelValues("matched")
	m.checkpoints.WithLabelValues("mismatch")
	m.records.WithLabelValues(Applied, "")
	for _, c := range []string{CodeConflict, CodeInvalid, CodeGarbled, CodeUnauthenticated} {
		m.records.WithLabelValues(Refused, c)
	}
	reg.MustRegister(m.revision, m.source, m.records, m.errors, m.stale, m.unsafe, m.checkpoints)
	return m
}

// Set publishes info as the policy in force.
func (m *Metrics) Set(info Info) {
	m.revision.Set(float64(info.Revision))
	m.stale.Set(float64(boolInt(info.Status == StatusStale)))
	for _, s := range []string{SourceFile, SourceKafka, SourceCache, SourceBootstrap} {
		v := 0.0
		if s == info.Source {
			v = 1
		}
		m.source.WithLabelValues(s).Set(v)
	}
}
