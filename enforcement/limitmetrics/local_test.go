package limitmetrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
)

type stats enforcement.LocalStats

func (s stats) LocalStats() enforcement.LocalStats { return enforcement.LocalStats(s) }

func TestLocalMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	limitmetrics.RegisterLocal(reg, stats{Entries: 3, QuotaEntries: 2, Bytes: 480, QuotaBytes: 200,
		Evictions: 7, QuotaEvictions: 1, Untracked: 4, QuotaUntracked: 0})
	want := `
# HELP limiter_local_bytes Heap the local tier holds, by table, as LIMITER_LOCAL_MAX_BYTES counts it.
# TYPE limiter_local_bytes gauge
limiter_local_bytes{table="buckets"} 480
limiter_local_bytes{table="quotas"} 200
# HELP limiter_local_entries Entries the local tier holds, by table (buckets: one per key and scope; quotas: one per key and quota).
# TYPE limiter_local_entries gauge
limiter_local_entries{table="buckets"} 3
limiter_local_entries{table="quotas"} 2
# HELP limiter_local_evictions_total Entries evicted to make room for new keys, by table (full buckets first; never one that is rejecting).
# TYPE limiter_local_evictions_total counter
limiter_local_evictions_total{table="buckets"} 7
limiter_local_evictions_total{table="quotas"} 1
# HELP limiter_local_untracked_total New keys decided without being kept, by table: the table was at its bound and held only entries that protect.
# TYPE limiter_local_untracked_total counter
limiter_local_untracked_total{table="buckets"} 4
limiter_local_untracked_total{table="quotas"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
