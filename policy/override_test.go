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
