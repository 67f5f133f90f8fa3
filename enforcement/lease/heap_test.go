package lease_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/testkit/heapstat"
)

// allowAll answers every Take as a store answers a key it has never seen,
// holding nothing: the heap measured is the lease layer's own.
type allowAll struct{}

func (allowAll) Take(_ context.Context, _, _ string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	return enforcement.Verdict{Allowed: true, Remaining: lim.Burst - cost, Now: time.Now()}, nil
}

// BenchmarkHeapPerState: the lease layer's heap per tracked (key, scope)
// under key rotation: b.N fresh keys, each decided once (cold: passed
// through, but tracked for hot-key detection) up to Config.MaxKeys
// (default 100,000, the bound), measured with runtime.ReadMemStats.
func BenchmarkHeapPerState(b *testing.B) {
	a := lease.New(allowAll{}, nil, lease.Config{MaxKeys: 1 << 30})
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 100, Burst: 200}
	before := heapstat.Live()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := "ip:10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		if _, err := a.Take(ctx, key, string([]byte("api")), lim, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(int64(heapstat.Live())-int64(before))/float64(b.N), "B/state")
	runtime.KeepAlive(a)
}
