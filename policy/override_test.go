package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
)

// TestOverrideResolution steps through what an override does: the
// key-and-scope one wins over the key's own, both over every rule; a tier
// override resolves as that tier; a rate override replaces the limit; the
// global ceiling caps either; an expired one stops applying at its instant.
func TestOverrideResolution(t *testing.T) {
	p := load(t, "testdata/resolve.yaml")
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	ov := policy.NewOverrides(0)
	ov.Put(policy.OverrideKey{Key: "acct_1"}, policy.Override{Tier: "pro", Reason: "upgrade"})
	ov.Put(policy.OverrideKey{Key: "acct_1", Scope: "api:search"}, policy.Override{Rate: 120, Period: "minute", Burst: 30, Reason: "deal"})
	ov.Put(policy.OverrideKey{Key: "ip:1.2.3.4"}, policy.Override{Rate: 50000, Burst: 90000, Reason: "partner"})
	ov.Put(policy.OverrideKey{Key: "acct_2"}, policy.Override{Tier: "ent", Expires: t0.Add(time.Hour), Reason: "trial"})
	ov.Put(policy.OverrideKey{Key: "acct_3"}, policy.Override{Quota: 500, QuotaPeriod: "day", Reason: "cap"})
	w := policy.NewWithOverrides(p, ov, nil)
	steps := []struct {
		key, scope, tier string
		at               time.Duration
		policy, wantTier string
		rate             float64
		burst            int64
		quota            int64
	}{
		{"acct_1", "api:other", "", 0, "override:acct_1", "pro", 100, 200, 0},    // the tier's own limit, no rule
		{"acct_1", "api:search", "", 0, "override:acct_1", "free", 2, 30, 0},     // key and scope first; 120/min
		{"acct_1", "api:search", "pro", 0, "override:acct_1", "pro", 2, 30, 0},   // the caller's tier, the override's limit
		{"ip:1.2.3.4", "x", "", 0, "override:ip:1.2.3.4", "free", 1000, 1500, 0}, // capped by global_ceiling, ahead of the prefix rule
		{"ip:8.8.8.8", "x", "", 0, "prefix", "free", 1, 5, 0},                    // no override: the rule
		{"acct_2", "x", "", 59 * time.Minute, "override:acct_2", "ent", 1000, 1500, 1000000},
		{"acct_2", "x", "", time.Hour, "free", "free", 10, 20, 0}, // expired at its instant
		{"acct_3", "x", "", 0, "override:acct_3", "free", 10, 20, 500},
	}
	for i, s := range steps {
		got, err := w.ResolveAt(s.key, s.scope, s.tier, t0.Add(s.at))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got.Policy != s.policy || got.Tier != s.wantTier || got.Rate != s.rate || got.Burst != s.burst || got.QuotaLimit != s.quota {
			t.Errorf("step %d %s/%s at +%s: got policy %q tier %q rate %v burst %d quota %d; want %q %q %v %d %d",
				i, s.key, s.scope, s.at, got.Policy, got.Tier, got.Rate, got.Burst, got.QuotaLimit, s.policy, s.wantTier, s.rate, s.burst, s.quota)
		}
	}
	if got, _ := w.ResolveAt("acct_3", "x", "", t0); got.QuotaPeriod != limits.PeriodDay || got.QuotaID != "override:acct_3" {
		t.Errorf("quota override: period %v id %q", got.QuotaPeriod, got.QuotaID)
	}
	// Without overrides the wrapper is the document.
	plain := policy.NewWithOverrides(p, nil, nil)
	a, _ := plain.Resolve("acct_1", "api:search", "")
	b, _ := p.Resolve("acct_1", "api:search", "")
	if a != b {
		t.Errorf("no overrides: %+v, document %+v", a, b)
	}
}

func TestOverrideValidate(t *testing.T) {
	p := load(t, "testdata/resolve.yaml")
	cases := []struct {
		o    policy.Override
		want []string // substrings of the error; none = valid
	}{
		{policy.Override{Tier: "pro", Reason: "r"}, nil},
		{policy.Override{Rate: 5, Burst: 10, Period: "minute", Reason: "r"}, nil},
		{policy.Override{Quota: 10, QuotaPeriod: "month", Reason: "r"}, nil},
		{policy.Override{Tier: "gold", Reason: "r"}, []string{`"gold" is not defined`}},
		{policy.Override{Tier: "pro"}, []string{"reason: required"}},
		{policy.Override{Reason: "r"}, []string{"sets nothing"}},
		{policy.Override{Tier: "pro", Rate: 1, Burst: 1, Reason: "r"}, []string{"not both"}},
		{policy.Override{Rate: -1, Burst: 0, Period: "week", Reason: "r"}, []string{"period:", "rate:", "burst:"}},
		{policy.Override{Quota: 10, QuotaPeriod: "year", Reason: "r"}, []string{"quota_period"}},
		{policy.Override{Store: "acme", Reason: "r"}, nil}, // a store alone moves the key
		{policy.Override{Store: "default", Reason: "r"}, []string{"not a store name"}},
		{policy.Override{Tier: "pro", Store: "a b", Reason: "r"}, []string{"not a store name"}},
	}
	for i, c := range cases {
		err := c.o.Validate(p)
		if len(c.want) == 0 {
			if err != nil {
				t.Errorf("case %d: %v", i, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("case %d: valid, want %v", i, c.want)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("case %d: %q lacks %q", i, err, w)
			}
		}
	}
}

// TestOverrideStore: an override routes its key to a named store ahead of
// the document's routing; alone it leaves the limit to the document; a
// key-and-scope override keeps the whole key's store; an expired one gives
// the key back to the document's store; Stores lists what is in use.
func TestOverrideStore(t *testing.T) {
	p := parse(t, `
version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
  pro:  { rate: 100, burst: 200 }
  big:  { rate: 1000, burst: 2000, store: bigstore }
rules:
  - { name: search, scope: "api:search", rate: 5, burst: 5 }
keys:
  acct_own: { tier: free, store: own }
`)
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	ov := policy.NewOverrides(0)
	ov.Put(policy.OverrideKey{Key: "acct_1"}, policy.Override{Store: "acme", Reason: "dedicated"})
	ov.Put(policy.OverrideKey{Key: "acct_1", Scope: "api:read"}, policy.Override{Rate: 1, Burst: 1, Reason: "deal"})
	ov.Put(policy.OverrideKey{Key: "acct_2"}, policy.Override{Tier: "pro", Store: "acme", Expires: t0.Add(time.Hour), Reason: "trial"})
	ov.Put(policy.OverrideKey{Key: "acct_3"}, policy.Override{Tier: "big", Reason: "upgrade"})
	ov.Put(policy.OverrideKey{Key: "acct_own"}, policy.Override{Tier: "pro", Reason: "upgrade"})
	w := policy.NewWithOverrides(p, ov, nil)
	steps := []struct {
		key, scope    string
		at            time.Duration
		policy, store string
		burst         int64
	}{
		{"acct_1", "api:search", 0, "search", "acme", 5},        // the rule's limit, the override's store
		{"acct_1", "api:read", 0, "override:acct_1", "acme", 1}, // the scope's override, the key's store
		{"acct_2", "x", 0, "override:acct_2", "acme", 200},
		{"acct_2", "x", time.Hour, "free", "", 20},              // expired: the document's store
		{"acct_3", "x", 0, "override:acct_3", "bigstore", 2000}, // the tier's store
		{"acct_own", "x", 0, "override:acct_own", "own", 200},   // the key's entry's store, whatever the tier
		{"acct_9", "x", 0, "free", "", 20},
	}
	for i, s := range steps {
		got, err := w.ResolveAt(s.key, s.scope, "", t0.Add(s.at))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got.Policy != s.policy || got.Store != s.store || got.Burst != s.burst {
			t.Errorf("step %d %s/%s at +%s: policy %q store %q burst %d; want %q %q %d", i, s.key, s.scope, s.at, got.Policy, got.Store, got.Burst, s.policy, s.store, s.burst)
		}
	}
	if got := strings.Join(w.Stores(), ","); got != "acme,bigstore,own" {
		t.Errorf("Stores() = %s", got)
	}
	ov2 := ov.Clone()
	ov2.Delete(policy.OverrideKey{Key: "acct_1"})
	ov2.Put(policy.OverrideKey{Key: "acct_2"}, policy.Override{Tier: "pro", Reason: "kept, moved back"})
	if got := ov2.Stores(); len(got) != 0 {
		t.Errorf("after the routing overrides went: Stores() = %v", got)
	}
	if got := strings.Join(ov.Stores(), ","); got != "acme" {
		t.Errorf("the clone changed the original: %s", got)
	}
	var stores []string
	ov.Each(func(k policy.OverrideKey, o policy.Override) {
		if o.Store != "" {
			stores = append(stores, k.Key+"="+o.Store)
		}
	})
	if len(stores) != 2 {
		t.Errorf("Each lost the store: %v", stores)
	}
}
