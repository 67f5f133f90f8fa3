package enforcement_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/testkit/heapstat"
)

// freshAuthority answers every Take as a shared store answers a key it has
// never seen: a full bucket spends cost, and the quota window has spent
// only that. It holds nothing per key, so that the heap a benchmark
// measures is the limiter's own.
type freshAuthority struct{ now func() time.Time }

func (a freshAuthority) Take(_ context.Context, _, _ string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	return enforcement.Verdict{
		Allowed:    true,
		Remaining:  lim.Burst - cost,
		ResetAfter: time.Duration(float64(cost) / lim.Rate * float64(time.Second)),
		Now:        a.now(),
		QuotaUsed:  cost,
	}, nil
}

// freeTier is deploy/policy.yaml's default tier: every key of a key
// rotation flood resolves to it, with its daily quota.
func freeTier() fixedPolicy {
	return fixedPolicy{enforcement.Resolved{
		Limit: enforcement.Limit{Rate: 10, Burst: 20, SoftLimitPercent: 80,
			QuotaLimit: 100000, QuotaPeriod: enforcement.PeriodDay, QuotaID: "free"},
		Policy: "free", Tier: "free", Cost: 1,
	}}
}

// BenchmarkHeapPerKey is the local tier's heap per tracked key under key
// rotation: b.N fresh keys, each asked once, as a client rotating API keys
// or addresses makes them. B/key is the heap that stays allocated,
// measured with runtime.ReadMemStats around the inserts: the entry, its
// key, its share of the table and the interned limit; with a quota (the
// free tier of deploy/policy.yaml) also the key's quota share.
// counted-B/key is what the bound counts (LocalStats), which must not be
// below it. The keys are as long as "ip:" and an IPv4 address.
func BenchmarkHeapPerKey(b *testing.B) {
	pro := fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 100, Burst: 200, SoftLimitPercent: 80},
		Policy: "pro", Tier: "pro", Cost: 1}}
	b.Run("tier=pro", func(b *testing.B) { heapPerKey(b, pro) })
	b.Run("tier=free", func(b *testing.B) { heapPerKey(b, freeTier()) })
}

func heapPerKey(b *testing.B, pol enforcement.Policy) {
	ctx := context.Background()
	l, err := enforcement.New(enforcement.Config{
		Authority: freshAuthority{now: time.Now},
		Policy:    pol,
		MaxKeys:   1 << 30,
		MaxBytes:  1 << 40,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	before := heapstat.Live()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Key and scope are fresh strings, as a decoded request's are.
		r := enforcement.Request{
			Key:   "ip:10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + "/" + strconv.Itoa(i>>24),
			Scope: string([]byte("api")),
		}
		if d, err := l.Check(ctx, r); err != nil || !d.Allowed {
			b.Fatalf("%+v %v", d, err)
		}
	}
	b.StopTimer()
	after := heapstat.Live()
	st := l.LocalStats()
	if st.Entries != b.N {
		b.Fatalf("%d entries for %d keys", st.Entries, b.N)
	}
	heap := float64(int64(after)-int64(before)) / float64(b.N)
	counted := float64(st.Bytes+st.QuotaBytes) / float64(b.N)
	b.ReportMetric(heap, "B/key")
	b.ReportMetric(counted, "counted-B/key")
	if b.N >= 10000 && counted < heap*0.95 {
		b.Errorf("the bound counts %.0f B/key, the heap holds %.0f", counted, heap)
	}
	runtime.KeepAlive(l)
}
