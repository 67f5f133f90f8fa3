package hotkeys

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/heapstat"
)

// BenchmarkHeapOfTracker: the tracker's heap once every counter of both
// windows holds a key (b.N decisions, each a new key, over two windows):
// it is fixed by Shards × Capacity whatever the number of keys. Reports
// the whole tracker (B/tracker) and per counter (B/counter).
func BenchmarkHeapOfTracker(b *testing.B) {
	now := int64(0)
	before := heapstat.Live()
	tr := New(Config{Now: func() time.Time { return epoch.Add(time.Duration(now)) }})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i == b.N/2 {
			now += int64(tr.cfg.Window) // the second window
		}
		tr.Record("ip:10."+strconv.Itoa(i>>16&255)+"."+strconv.Itoa(i>>8&255)+"."+strconv.Itoa(i&255), string([]byte("api")), true)
	}
	b.StopTimer()
	after := heapstat.Live()
	total := float64(int64(after) - int64(before))
	b.ReportMetric(total, "B/tracker")
	b.ReportMetric(total/float64(2*tr.cfg.Shards*tr.cfg.Capacity), "B/counter")
	runtime.KeepAlive(tr)
}

var epoch = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
