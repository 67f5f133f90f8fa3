package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

// TestGlobalLimitUnderClassesRefused: a tier or rule of scope global is
// refused under a class below share 1 (a region's pool keeps no floor),
// naming the field; with every class at share 1, or without priorities,
// it loads as before.
func TestGlobalLimitUnderClassesRefused(t *testing.T) {
	const body = `
tiers:
  free: { rate: 10, burst: 20 }
  world: { rate: 10, burst: 20, scope: global }
rules:
  - { name: everywhere, scope: "api", region_scope: global, rate: 5, burst: 5 }
`
	_, err := policy.Parse([]byte("version: 1\ndefault_tier: free\npriorities: { critical: 1, default: 0.8 }" + body))
	if err == nil {
		t.Fatal("a global limit under a class of share 0.8 loaded")
	}
	for _, want := range []string{"tiers.world.scope", "rules[0].region_scope", "cannot keep a priority class's floor"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, head := range []string{"version: 1\ndefault_tier: free\npriorities: { critical: 1, default: 1 }", "version: 1\ndefault_tier: free"} {
		if _, err := policy.Parse([]byte(head + body)); err != nil {
			t.Errorf("%q: %v", head, err)
		}
	}
}

// TestGlobalOverrideUnderClassesRefused: an override of scope global is
// refused under a class below share 1, as a global tier is at load.
func TestGlobalOverrideUnderClassesRefused(t *testing.T) {
	const body = "\ntiers:\n  free: { rate: 10, burst: 20 }\n"
	shed, err := policy.Parse([]byte("version: 1\ndefault_tier: free\npriorities: { critical: 1, default: 0.8 }" + body))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := policy.Parse([]byte("version: 1\ndefault_tier: free" + body))
	if err != nil {
		t.Fatal(err)
	}
	o := policy.Override{Tier: "free", Scope: policy.ScopeGlobal, Reason: "a test"}
	if err := o.Validate(shed); err == nil || !strings.Contains(err.Error(), "priority class's floor") {
		t.Fatalf("a global override under a class of share 0.8: %v", err)
	}
	if err := o.Validate(plain); err != nil {
		t.Fatalf("a global override without priorities: %v", err)
	}
}
