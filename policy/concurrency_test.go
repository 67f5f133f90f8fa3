package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

const concurrencyPolicy = `version: 1
default_tier: free
priorities: { critical: 1, default: 0.8, sheddable: 0.5 }
tiers:
  free: { rate: 10, burst: 20 }
  reports: { concurrency: 4 }
  both: { rate: 10, burst: 20, concurrency: 8 }
rules:
  - { name: slow-export, scope: export, concurrency: 2 }
  - { name: no-slots, tier: both, scope: bulk, concurrency: 0 }
  - { name: rated, tier: reports, scope: rated, rate: 5, burst: 5 }
`

// TestConcurrencyResolves: concurrency alone, beside a rate, set and
// removed by a rule, set by an override; priorities read with their shares.
func TestConcurrencyResolves(t *testing.T) {
	p, err := policy.Parse([]byte(concurrencyPolicy))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		key, scope, tier string
		conc             int64
		hasRate          bool
		policyName       string
	}{
		{"a", "read", "", 0, true, "free"},
		{"a", "read", "reports", 4, false, "reports"},
		{"a", "read", "both", 8, true, "both"},
		{"a", "export", "both", 2, true, "slow-export"},
		{"a", "bulk", "both", 0, true, "no-slots"},
		{"a", "rated", "reports", 4, true, "rated"},
	}
	for _, c := range cases {
		res, err := p.Resolve(c.key, c.scope, c.tier)
		if err != nil || res.Concurrency != c.conc || res.HasRate() != c.hasRate || res.Policy != c.policyName {
			t.Errorf("%+v: got %+v, %v", c, res, err)
		}
	}
	if !p.HasConcurrency() {
		t.Error("HasConcurrency is false")
	}
	for name, want := range map[string]float64{"critical": 1, "default": 0.8, "": 0.8, "sheddable": 0.5} {
		if got, ok := p.PriorityShare(name); !ok || got != want {
			t.Errorf("share of %q: %v, %v; want %v", name, got, ok, want)
		}
	}
	if _, ok := p.PriorityShare("bulk"); ok {
		t.Error("an undefined class has a share")
	}

	plain, err := policy.Parse([]byte(validHead))
	if err != nil {
		t.Fatal(err)
	}
	if plain.HasConcurrency() {
		t.Error("a policy without concurrency says it has some")
	}
	for _, name := range []string{"critical", "default", "sheddable", ""} {
		if s, ok := plain.PriorityShare(name); !ok || s != 1 {
			t.Errorf("built-in class %q: %v, %v", name, s, ok)
		}
	}

	ov := policy.NewOverrides(1)
	o := policy.Override{Concurrency: 3, Reason: "a slow tenant"}
	if err := o.Validate(plain); err != nil {
		t.Fatal(err)
	}
	ov.Put(policy.OverrideKey{Key: "acme"}, o)
	w := policy.NewWithOverrides(plain, ov, nil)
	if !w.HasConcurrency() {
		t.Error("an override's concurrency is not seen")
	}
	res, err := w.Resolve("acme", "read", "")
	if err != nil || res.Concurrency != 3 || !res.HasRate() || res.Burst != 5 {
		t.Errorf("override of concurrency alone: %+v, %v", res, err)
	}
	ov.Put(policy.OverrideKey{Key: "big"}, policy.Override{Rate: 100, Burst: 100, Concurrency: 7, Reason: "deal"})
	if res, err := w.Resolve("big", "read", ""); err != nil || res.Concurrency != 7 || res.Burst != 100 {
		t.Errorf("override with rate and concurrency: %+v, %v", res, err)
	}
	var seen int64
	ov.Each(func(k policy.OverrideKey, o policy.Override) {
		if k.Key == "big" {
			seen = o.Concurrency
		}
	})
	if seen != 7 {
		t.Errorf("the override as listed lost its concurrency: %d", seen)
	}
	if err := (policy.Override{Concurrency: -1, Reason: "x"}).Validate(plain); err == nil || !strings.Contains(err.Error(), "concurrency: must be between 1 and") {
		t.Errorf("negative override concurrency: %v", err)
	}
}

// TestConcurrencyRefusals: each mistake is named with its field and line.
func TestConcurrencyRefusals(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string
	}{
		{"negative", "version: 1\ndefault_tier: free\ntiers:\n  free: { concurrency: -1 }\n",
			[]string{"tiers.free.concurrency (line 4): must be between 1 and 1000000"}},
		{"too large", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 1, concurrency: 1000001 }\n",
			[]string{"tiers.free.concurrency (line 4): must be between 1 and 1000000"}},
		{"fraction", "version: 1\ndefault_tier: free\ntiers:\n  free: { concurrency: 2.5 }\n",
			[]string{`tiers.free.concurrency (line 4): must be a whole number, got "2.5"`}},
		{"rate without burst beside concurrency", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 5, concurrency: 2 }\n",
			[]string{"tiers.free.burst (line 4): must be between 1 and 2^50, got 0"}},
		{"quota on concurrency alone", "version: 1\ndefault_tier: free\ntiers:\n  free: { concurrency: 2, quota: { limit: 10, period: day } }\n",
			[]string{"tiers.free.quota (line 4): a quota is counted on a rate's bucket"}},
		{"rule rate without burst on concurrency alone", "version: 1\ndefault_tier: free\ntiers:\n  free: { concurrency: 2 }\nrules:\n  - { name: r, rate: 5 }\n",
			[]string{"rules[0] (line 6): rate and burst go together"}},
		{"rule concurrency negative", validHead + "rules:\n  - { name: r, concurrency: -3 }\n",
			[]string{"rules[0].concurrency (line 6): must be between 1 and 1000000"}},
		{"share out of range", validHead + "priorities: { default: 1, sheddable: 1.5, bulk: 0 }\n",
			[]string{"priorities.bulk (line 5): a share must be > 0 and ≤ 1", "priorities.sheddable (line 5): a share must be > 0 and ≤ 1"}},
		{"no default class", validHead + "priorities: { critical: 1, sheddable: 0.5 }\n",
			[]string{`priorities (line 5): must define "default"`}},
	}
	for _, c := range cases {
		_, err := policy.Parse([]byte(c.src))
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", c.name, err, w)
			}
		}
	}
}
