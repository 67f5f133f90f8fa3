package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

func TestUnknownWhileDegraded(t *testing.T) {
	p, err := policy.Parse([]byte(`
version: 1
default_tier: a
tiers:
  a: { rate: 1, burst: 1, quota: { limit: 5, period: day, unknown_while_degraded: deny } }
  b: { rate: 1, burst: 1, quota: { limit: 5, period: day } }
rules:
  - { name: r, key: k, quota: { limit: 9, period: hour, unknown_while_degraded: deny } }
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, tier string
		deny      bool
	}{{"x", "a", true}, {"x", "b", false}, {"k", "b", true}} {
		res, err := p.Resolve(tc.key, "s", tc.tier)
		if err != nil || res.QuotaDenyUnknown != tc.deny {
			t.Errorf("key %s tier %s: deny unknown %v (%v), want %v", tc.key, tc.tier, res.QuotaDenyUnknown, err, tc.deny)
		}
	}
	_, err = policy.Parse([]byte(`
version: 1
default_tier: a
tiers:
  a: { rate: 1, burst: 1, quota: { limit: 5, period: day, unknown_while_degraded: maybe } }
`))
	if err == nil || !strings.Contains(err.Error(), "tiers.a.quota.unknown_while_degraded") {
		t.Fatalf("an unknown value: %v, want a problem naming the field", err)
	}
}
