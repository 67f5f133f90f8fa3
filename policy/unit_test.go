package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

// TestCostUnit: a tier names the unit its costs count, a rule may name
// another, and a name that is not a plain lower-case word is refused.
func TestCostUnit(t *testing.T) {
	p := parse(t, `version: 1
default_tier: llm
tiers:
  llm: { rate: 100000, period: minute, burst: 100000, unit: tokens }
  plain: { rate: 10, burst: 10 }
rules:
  - { name: scans, tier: llm, scope: "db:*", unit: bytes }
`)
	for _, c := range []struct{ scope, tier, want string }{
		{"llm:tokens", "", "tokens"}, {"db:scan", "", "bytes"}, {"api", "plain", ""},
	} {
		res, err := p.Resolve("acct_1", c.scope, c.tier)
		if err != nil || res.Unit != c.want {
			t.Errorf("%s/%s: unit %q, want %q (%v)", c.scope, c.tier, res.Unit, c.want, err)
		}
	}
	_, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1, burst: 1, unit: \"Tokens!\" }\n"))
	if err == nil || !strings.Contains(err.Error(), "tiers.t.unit") {
		t.Fatalf("a bad unit: %v", err)
	}
}
