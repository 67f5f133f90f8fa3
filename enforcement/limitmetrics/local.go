package limitmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
)

// LocalSource is what the local tier collector reads (an
// *enforcement.Limiter).
type LocalSource interface {
	LocalStats() enforcement.LocalStats
}

// RegisterLocal registers the local tier's size on reg, read at scrape
// time: limiter_local_entries, limiter_local_bytes,
// limiter_local_evictions_total and limiter_local_untracked_total, each by
// table: "buckets" for the (key, scope) entries, "quotas" for the keys'
// quota shares.
func RegisterLocal(reg prometheus.Registerer, src LocalSource) {
	reg.MustRegister(localCollector{src: src})
}

var (
	localEntriesDesc = prometheus.NewDesc("limiter_local_entries",
		"Entries the local tier holds, by table (buckets: one per key and scope; quotas: one per key and quota).", []string{"table"}, nil)
	localBytesDesc = prometheus.NewDesc("limiter_local_bytes",
		"Heap the local tier holds, by table, as LIMITER_LOCAL_MAX_BYTES counts it.", []string{"table"}, nil)
	localEvictionsDesc = prometheus.NewDesc("limiter_local_evictions_total",
		"Entries evicted to make room for new keys, by table (full buckets first; never one that is rejecting).", []string{"table"}, nil)
	localUntrackedDesc = prometheus.NewDesc("limiter_local_untracked_total",
		"New keys decided without being kept, by table: the table was at its bound and held only entries that protect.", []string{"table"}, nil)
)

type localCollector struct{ src LocalSource }

func (c localCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- localEntriesDesc
	ch <- localBytesDesc
	ch <- localEvictionsDesc
	ch <- localUntrackedDesc
}

func (c localCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.LocalStats()
	for _, t := range []struct {
		name               string
		entries            int
		bytes              int64
		evicted, untracked uint64
	}{
		{"buckets", st.Entries, st.Bytes, st.Evictions, st.Untracked},
		{"quotas", st.QuotaEntries, st.QuotaBytes, st.QuotaEvictions, st.QuotaUntracked},
	} {
		ch <- prometheus.MustNewConstMetric(localEntriesDesc, prometheus.GaugeValue, float64(t.entries), t.name)
		ch <- prometheus.MustNewConstMetric(localBytesDesc, prometheus.GaugeValue, float64(t.bytes), t.name)
		ch <- prometheus.MustNewConstMetric(localEvictionsDesc, prometheus.CounterValue, float64(t.evicted), t.name)
		ch <- prometheus.MustNewConstMetric(localUntrackedDesc, prometheus.CounterValue, float64(t.untracked), t.name)
	}
}
