package policy_test

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/heapstat"
)

const millionOverrides = 1_000_000

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
		before := heapstat.Live()
		start := time.Now()
		ov := millionSet(b)
		took := time.Since(start)
		after := heapstat.Live()
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

// BenchmarkResolveInterleaved compares resolution without overrides (the
// document alone, as in file mode) and with 1,000,000 loaded, in the same
// run: each round times a batch of each in turn, so that a loaded
// machine slows every variant alike. Keys cycle through 1,024 (what the
// caches hold) or 65,536 (more than they hold of a million-override set).
// It reports ns per
// resolution of each and the median over rounds of each one's ratio to
// the document alone (1.00 = as fast).
func BenchmarkResolveInterleaved(b *testing.B) {
	p := load(b, "testdata/bench50.yaml")
	big := policy.NewWithOverrides(p, millionSet(b), nil)
	none := policy.NewWithOverrides(p, nil, nil)
	b.Run("keys1k", func(b *testing.B) { resolveInterleaved(b, p, big, none, 1<<10) })
	b.Run("keys64k", func(b *testing.B) { resolveInterleaved(b, p, big, none, 1<<16) })
}

func resolveInterleaved(b *testing.B, p *policy.Policy, big, none *policy.WithOverrides, nkeys int) {
	miss, hit := make([]string, nkeys), make([]string, nkeys)
	for i := range nkeys {
		miss[i] = fmt.Sprintf("user_%07d", i*15)
		hit[i] = fmt.Sprintf("acct_%07d", i*15)
	}
	variants := []struct {
		name string
		res  func(key string) error
		keys []string
	}{
		{"document", func(k string) error { _, err := p.Resolve(k, "api:search", ""); return err }, miss},
		{"wrapper-none", func(k string) error { _, err := none.Resolve(k, "api:search", ""); return err }, miss},
		{"1M-miss", func(k string) error { _, err := big.Resolve(k, "api:search", ""); return err }, miss},
		{"1M-hit", func(k string) error { _, err := big.Resolve(k, "api:search", ""); return err }, hit},
		{"document-hitkeys", func(k string) error { _, err := p.Resolve(k, "api:search", ""); return err }, hit},
	}
	const batch = 2000
	total := make([]time.Duration, len(variants))
	ratios := make([][]float64, len(variants))
	b.ResetTimer()
	for round := 0; round*batch < b.N; round++ {
		var took [8]time.Duration
		for v, vr := range variants {
			start := time.Now()
			for i := range batch {
				if err := vr.res(vr.keys[(round*batch+i)&(nkeys-1)]); err != nil {
					b.Fatal(err)
				}
			}
			took[v] = time.Since(start)
			total[v] += took[v]
		}
		for v := range variants {
			base := took[0]
			if variants[v].name == "1M-hit" {
				base = took[4]
			}
			ratios[v] = append(ratios[v], float64(took[v])/float64(base))
		}
	}
	rounds := float64(len(ratios[0]))
	for v, vr := range variants {
		r := ratios[v]
		sort.Float64s(r)
		b.ReportMetric(float64(total[v].Nanoseconds())/(rounds*batch), vr.name+"-ns")
		if v > 0 && v < 4 {
			b.ReportMetric(r[len(r)/2], vr.name+"-ratio")
		}
	}
}

// BenchmarkCheckInterleaved is BenchmarkResolveInterleaved on the decision
// path: Limiter.Check (in-process authority, limit cached per entry)
// under the document alone and under the document with 1,000,000
// overrides, batch by batch in one run, over 1,024 keys without an
// override. It reports ns per decision of each and the median ratio.
func BenchmarkCheckInterleaved(b *testing.B) {
	p := load(b, "testdata/bench50.yaml")
	pols := []enforcement.Policy{p, policy.NewWithOverrides(p, millionSet(b), nil)}
	var lims []*enforcement.Limiter
	for _, pol := range pols {
		lim, err := enforcement.New(enforcement.Config{
			Authority: enforcement.NewMemoryAuthority(nil, 1000), Policy: pol, LocalHeadroom: 1e9,
		})
		if err != nil {
			b.Fatal(err)
		}
		lims = append(lims, lim)
	}
	const nkeys, batch = 1 << 10, 2000
	reqs := make([]enforcement.Request, nkeys)
	for i := range reqs {
		reqs[i] = enforcement.Request{Key: fmt.Sprintf("user_%07d", i*977), Scope: "api:search", HasCost: true}
	}
	ctx := context.Background()
	var total [2]time.Duration
	var ratios []float64
	b.ResetTimer()
	for round := 0; round*batch < b.N; round++ {
		var took [2]time.Duration
		for v, lim := range lims {
			start := time.Now()
			for i := range batch {
				if _, err := lim.Check(ctx, reqs[(round*batch+i)&(nkeys-1)]); err != nil {
					b.Fatal(err)
				}
			}
			took[v] = time.Since(start)
			total[v] += took[v]
		}
		ratios = append(ratios, float64(took[1])/float64(took[0]))
	}
	sort.Float64s(ratios)
	n := float64(len(ratios) * batch)
	b.ReportMetric(float64(total[0].Nanoseconds())/n, "document-ns")
	b.ReportMetric(float64(total[1].Nanoseconds())/n, "1M-ns")
	b.ReportMetric(ratios[len(ratios)/2], "1M-ratio")
}
