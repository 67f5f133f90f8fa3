package consumer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

type metrics struct {
	lag         *prometheus.GaugeVec
	assigned    prometheus.Gauge
	batchEvents prometheus.Histogram
	written     prometheus.Counter
	duplicates  prometheus.Counter
	lookups     prometheus.Counter
	bad         prometheus.Counter
	delay       prometheus.Histogram
	chUp        prometheus.Gauge
	restarts    prometheus.Counter
	stalls      *prometheus.CounterVec
	epochs      *prometheus.CounterVec
	gaps        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		lag:         promdecl.GaugeVec("meter_consumer_lag_messages", "Messages between the last one read and the partition's high watermark.", "partition"),
		assigned:    promdecl.Gauge("meter_partitions_assigned", "Kafka partitions this consumer owns."),
		batchEvents: promdecl.Histogram("meter_batch_messages", "Kafka messages per batch written to ClickHouse.", prometheus.ExponentialBuckets(1, 4, 10)),
		written:     promdecl.Counter("meter_events_written_total", "Distinct events written (counted once, when their batch completes)."),
		lookups:     promdecl.Counter("meter_dedup_lookups_total", "Late messages (not decidable from the in-memory window) whose event_id was looked up in event_ids."),
		duplicates:  promdecl.Counter("meter_duplicates_discarded_total", "Messages discarded because their event_id was already seen at an earlier offset."),
		bad:         promdecl.Counter("meter_bad_messages_total", "Messages that are not decodable decision events (skipped)."),
		delay:       promdecl.Histogram("meter_ingest_delay_seconds", "From decision time (event ts) to the event's batch being in every table.", []float64{.05, .1, .25, .5, .75, 1, 1.5, 2, 3, 4, 5, 7.5, 10, 15, 30, 60, 300}),
		chUp:        promdecl.Gauge("meter_clickhouse_up", "1 when the last ClickHouse ping succeeded."),
		restarts:    promdecl.Counter("meter_partition_restarts_total", "Times a partition reader restarted from the progress stored in ClickHouse after an error."),
		stalls:      promdecl.CounterVec("meter_partition_stalls_total", "Times a partition with messages to read wrote nothing to ClickHouse for METER_STALL_AFTER while nothing failed; each time its reader was restarted.", "partition"),
		epochs:      promdecl.CounterVec("meter_log_epochs_total", "Times a partition's log started over (reason restarted: a fresh broker, a recreated topic, another cluster; replaced: recreated and grown past the stored offset; truncated: the same log lost its tail) and a new epoch was recorded; the new log is read from its start, history kept.", "partition", "reason"),
		gaps:        promdecl.CounterVec("meter_log_gap_messages_total", "Messages deleted from the log (retention) before the consumer read them: never counted in the usage tables.", "partition"),
	}
	for _, c := range []prometheus.Collector{m.lag, m.assigned, m.batchEvents, m.written, m.duplicates, m.lookups, m.bad, m.delay, m.chUp, m.restarts, m.stalls, m.epochs, m.gaps} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// InsertMetrics registers the ClickHouse INSERT metrics on reg and returns
// the observer to pass to chsink.New: latency and errors by table.
func InsertMetrics(reg prometheus.Registerer) (chsink.Observer, error) {
	secs := promdecl.HistogramVec("meter_insert_duration_seconds", "Duration of one ClickHouse INSERT, by table.", prometheus.ExponentialBuckets(0.001, 2, 15), "table")
	rows := promdecl.HistogramVec("meter_insert_rows", "Rows per ClickHouse INSERT (rollups: aggregated rows plus one marker), by table.", prometheus.ExponentialBuckets(1, 4, 10), "table")
	errs := promdecl.CounterVec("meter_insert_errors_total", "ClickHouse INSERTs that failed, by table.", "table")
	for _, c := range []prometheus.Collector{secs, rows, errs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return func(t chsink.Table, n int, d time.Duration, err error) {
		if err != nil {
			errs.WithLabelValues(t.String()).Inc()
			return
		}
		secs.WithLabelValues(t.String()).Observe(d.Seconds())
		rows.WithLabelValues(t.String()).Observe(float64(n))
	}, nil
}
