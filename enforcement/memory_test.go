package enforcement_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
)

func TestMemoryAuthorityContract(t *testing.T) {
	authoritytest.Run(t, enforcement.NewMemoryAuthority(nil, 1000))
}

func TestMemoryAuthoritySweepForgetsOnlyFullBuckets(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)
	m := enforcement.NewMemoryAuthority(func() time.Time { return now }, 1000)
	lim := enforcement.Limit{Rate: 1, Burst: 2}
	if _, err := m.Take(context.Background(), "k", "s", lim, 2); err != nil {
		t.Fatal(err)
	}
	if n := m.Sweep(now.Add(time.Second)); n != 0 || m.Len() != 1 {
		t.Fatalf("half-refilled bucket swept: removed %d, len %d", n, m.Len())
	}
	if n := m.Sweep(now.Add(2 * time.Second)); n != 1 || m.Len() != 0 {
		t.Fatalf("full bucket kept: removed %d, len %d", n, m.Len())
	}
}

// TestKeyRotationKeepsWhatProtects: 200 keys flooded past their limit (the
// store rejected them; the local tier knows their buckets are empty), then
// 20,000 fresh keys through a local tier with room for 1,024 entries. Every
// flooded key is still rejected locally, without a store call, and the
// tier stays within its bounds in entries and in bytes.
func TestKeyRotationKeepsWhatProtects(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	const maxKeys, maxBytes = 1024, 1 << 20
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(0.01, 2), Now: clk.Now,
		MaxKeys: maxKeys, MaxBytes: maxBytes})
	ctx := context.Background()
	flooded := make([]string, 200)
	for i := range flooded {
		flooded[i] = "flooded-" + strconv.Itoa(i)
		for j := 0; j < 3; j++ {
			if _, err := l.Check(ctx, req(flooded[i], 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 20_000; i++ {
		clk.Add(time.Millisecond)
		if d, err := l.Check(ctx, req("fresh-"+strconv.Itoa(i), 1)); err != nil || !d.Allowed {
			t.Fatalf("fresh key %d: %+v, %v", i, d, err)
		}
	}
	st := l.LocalStats()
	if st.Entries > maxKeys || st.Bytes > maxBytes*2/3 || st.Evictions < 10_000 {
		t.Fatalf("after the rotation: %+v (bounds: %d entries, %d bytes)", st, maxKeys, maxBytes*2/3)
	}
	calls := auth.calls.Load()
	for _, k := range flooded {
		d, err := l.Check(ctx, req(k, 1))
		if err != nil || d.Allowed || d.Source != enforcement.SourceLocal {
			t.Fatalf("%s after the rotation: %+v, %v; want a local rejection", k, d, err)
		}
	}
	if n := auth.calls.Load() - calls; n != 0 {
		t.Fatalf("%d store calls for keys the local tier knew to be empty", n)
	}
}

// slowPolicy: keys starting "slow-" refill one token in 10,000 s, others
// one a second; both hold two.
type slowPolicy struct{}

func (slowPolicy) Resolve(key, _, _ string) (enforcement.Resolved, error) {
	rate := 1.0
	if strings.HasPrefix(key, "slow-") {
		rate = 1e-4
	}
	return enforcement.Resolved{Limit: enforcement.Limit{Rate: rate, Burst: 2}, Policy: "p", Tier: "t", Cost: 1}, nil
}

// TestEvictionPrefersFullBuckets: 64 keys spent first (partly, and they stay
// so), then four times as many other keys as the tier holds, 100 ms apart,
// each full again a second after its spend. The full ones go, although the
// partly spent keys are older: a partly spent key's next request is still
// answered from what the tier learned (a local rejection of a cost above
// what is left), with no store call.
func TestEvictionPrefersFullBuckets(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	const maxKeys = 64 * 32
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: slowPolicy{}, Now: clk.Now, MaxKeys: maxKeys})
	ctx := context.Background()
	slow := make([]string, 64)
	for i := range slow {
		slow[i] = "slow-" + strconv.Itoa(i)
		l.Check(ctx, req(slow[i], 1))
	}
	for i := 0; i < 4*maxKeys; i++ {
		clk.Add(100 * time.Millisecond)
		l.Check(ctx, req("other-"+strconv.Itoa(i), 1))
	}
	if st := l.LocalStats(); st.Evictions < 2*maxKeys || st.Untracked != 0 || st.Entries != maxKeys {
		t.Fatalf("%+v: want evictions, a full tier, and room made for every new key", st)
	}
	calls := auth.calls.Load()
	for _, k := range slow {
		if d, _ := l.Check(ctx, req(k, 2)); d.Allowed || d.Source != enforcement.SourceLocal {
			t.Fatalf("%s: %+v; its entry was evicted before full ones", k, d)
		}
	}
	if n := auth.calls.Load() - calls; n != 0 {
		t.Fatalf("%d store calls for partly spent keys", n)
	}
}

// TestMemoryAuthorityBoundInBytes: single-node mode's store under key
// rotation stays within its bytes, and a key it rejects stays rejected.
func TestMemoryAuthorityBoundInBytes(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)
	const bound = 1 << 20
	m := enforcement.NewMemoryAuthorityBytes(func() time.Time { return now }, 1<<30, bound)
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 0.001, Burst: 1, QuotaLimit: 1000, QuotaPeriod: enforcement.PeriodDay, QuotaID: "q"}
	if v, _ := m.Take(ctx, "spent", "s", lim, 1); !v.Allowed {
		t.Fatal("first take refused")
	}
	for i := 0; i < 50_000; i++ {
		now = now.Add(time.Millisecond)
		if _, err := m.Take(ctx, "fresh-"+strconv.Itoa(i), "s", lim, 1); err != nil {
			t.Fatal(err)
		}
	}
	if b := m.Bytes(); b > bound || m.Len() < 1000 {
		t.Fatalf("%d bytes for %d buckets, bound %d", b, m.Len(), bound)
	}
	if v, _ := m.Take(ctx, "spent", "s", lim, 1); v.Allowed {
		t.Fatal("an empty bucket was forgotten under key rotation")
	}
}
