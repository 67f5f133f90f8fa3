package policy_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

const millionOverrides = 1_000_000

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func millionSet(b *testing.B) *policy.Overrides {
	b.Helper()
	ov := policy.NewOverrides(millionOverrides)
	for i := range millionOverrides {
		o := policy.Override{Tier: "pro", Reason: "deal"}
		if i%2 == 1 {
			o = policy.Override{Rate: 50, Burst: 100, Reason: "deal"}
		}
		scope := ""
		if i%4 == 3 {
			scope = "api:search"
		}
		ov.Put(policy.OverrideKey{Key: fmt.Sprintf("acct_%07d", i), Scope: scope}, o)
	}
	return ov
}

// BenchmarkOverridesLoad1M: build a set of 1,000,000 overrides (keys of
// 12 bytes, a quarter with a scope); reports the bytes each costs on the
// live heap, key strings included.
func BenchmarkOverridesLoad1M(b *testing.B) {
	for range b.N {
		before := heapInUse()
		start := time.Now()
		ov := millionSet(b)
		took := time.Since(start)
		after := heapInUse()
		b.ReportMetric(float64(after-before)/millionOverrides, "bytes/override")
		b.ReportMetric(took.Seconds(), "s/load")
		runtime.KeepAlive(ov)
	}
}

// BenchmarkResolveOverrides compares resolution of a key without an
// override, with no overrides loaded and with 1,000,000; and of a key with
// one.
func BenchmarkResolveOverrides(b *testing.B) {
	p := load(b, "testdata/bench50.yaml")
	big := policy.NewWithOverrides(p, millionSet(b), nil)
	none := policy.NewWithOverrides(p, nil, nil)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("user_%07d", i*977)
	}
	hit := make([]string, 1024)
	for i := range hit {
		hit[i] = fmt.Sprintf("acct_%07d", i*977)
	}
	run := func(name string, w *policy.WithOverrides, keys []string) {
		b.Run(name, func(b *testing.B) {
			now := time.Now()
			b.ReportAllocs()
			for i := range b.N {
				if _, err := w.ResolveAt(keys[i&1023], "api:search", "", now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("document-only", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, err := p.Resolve(keys[i&1023], "api:search", ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	run("no-overrides", none, keys)
	run("1M-overrides-miss", big, keys)
	run("1M-overrides-hit", big, hit)
}
