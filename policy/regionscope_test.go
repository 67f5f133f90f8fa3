package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

const regionScoped = `
version: 1
default_tier: free
tiers:
  free:   { rate: 10, burst: 20 }
  global: { rate: 100, burst: 100, scope: global }
  local:  { rate: 100, burst: 100, scope: regional }
rules:
  - { name: search-regional, tier: global, scope: "api:search", rate: 50, region_scope: regional }
  - { name: export-global,   tier: free,   scope: "api:export", rate: 5, region_scope: global }
  - { name: upload,          tier: global, scope: "api:upload", rate: 7 }
`

// TestRegionScope: a tier's scope resolves into Resolved.Global (absent =
// regional), a rule's region_scope wins over its tier's and, absent,
// inherits it; an override's scope wins over both, alone or with a limit.
func TestRegionScope(t *testing.T) {
	p := parse(t, regionScoped)
	for _, c := range []struct {
		key, scope, tier string
		global           bool
	}{
		{"k", "x", "free", false},
		{"k", "x", "global", true},
		{"k", "x", "local", false},
		{"k", "api:search", "global", false}, // the rule says regional
		{"k", "api:export", "free", true},    // the rule says global
		{"k", "api:upload", "global", true},  // the rule inherits the tier's
	} {
		res, err := p.Resolve(c.key, c.scope, c.tier)
		if err != nil || res.Global != c.global {
			t.Errorf("%s/%s tier %s: global %v (%v), want %v", c.key, c.scope, c.tier, res.Global, err, c.global)
		}
	}
	ov := policy.NewOverrides(0)
	put := func(k policy.OverrideKey, o policy.Override) {
		t.Helper()
		if err := o.Validate(p); err != nil {
			t.Fatal(err)
		}
		ov.Put(k, o)
	}
	put(policy.OverrideKey{Key: "a"}, policy.Override{Scope: "global", Reason: "shared"})
	put(policy.OverrideKey{Key: "b"}, policy.Override{Tier: "global", Scope: "regional", Reason: "each its own"})
	put(policy.OverrideKey{Key: "c", Scope: "x"}, policy.Override{Rate: 3, Burst: 3, Reason: "scoped"})
	put(policy.OverrideKey{Key: "c"}, policy.Override{Scope: "global", Reason: "whole key"})
	w := policy.NewWithOverrides(p, ov, nil)
	for _, c := range []struct {
		key, scope string
		global     bool
	}{{"a", "x", true}, {"b", "x", false}, {"c", "x", true}, {"c", "y", true}, {"d", "x", false}} {
		res, err := w.Resolve(c.key, c.scope, "")
		if err != nil || res.Global != c.global {
			t.Errorf("override %s/%s: global %v (%v), want %v", c.key, c.scope, res.Global, err, c.global)
		}
	}
	got := map[string]string{}
	ov.Each(func(k policy.OverrideKey, o policy.Override) { got[k.Key+"/"+k.Scope] = o.Scope })
	if got["a/"] != "global" || got["b/"] != "regional" || got["c/x"] != "" {
		t.Errorf("Each: %v", got)
	}
}

func TestRegionScopeRefused(t *testing.T) {
	src := strings.Replace(regionScoped, "scope: global }", "scope: worldwide }", 1)
	src = strings.Replace(src, "region_scope: regional", "region_scope: everywhere", 1)
	_, err := policy.Parse([]byte(src))
	if err == nil || !strings.Contains(err.Error(), `tiers.global.scope (line 6): must be global or regional, got "worldwide"`) ||
		!strings.Contains(err.Error(), `rules[0].region_scope`) {
		t.Fatalf("error: %v", err)
	}
	if err := (policy.Override{Scope: "planet", Reason: "x"}).Validate(nil); err == nil || !strings.Contains(err.Error(), "scope: must be global or regional") {
		t.Fatalf("override: %v", err)
	}
}
