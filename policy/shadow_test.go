package policy

import (
	"strings"
	"testing"
)

const shadowYAML = `
version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20, quota: { limit: 1000, period: day } }
  pro:  { rate: 100, burst: 200 }
rules:
  - { name: search, scope: "api:search", rate: 5, burst: 10 }
  - { name: search-trial, scope: "api:search", rate: 2, burst: 4, shadow: true }
  - { name: pro-trial, tier: pro, rate: 50, shadow: true }
  - { name: vip, key: vip, rate: 1000 }
  - { name: web-trial, scope: "web*", rate: 1, shadow: true }
`

func TestShadowRulesAreNeverEnforcedAndResolveBesideIt(t *testing.T) {
	p, err := Parse([]byte(shadowYAML))
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasShadow() {
		t.Fatal("HasShadow false")
	}
	cases := []struct {
		key, scope, tier string
		enforced         string
		shadow           string // "" = no shadow limit applies
		shadowRate       float64
		shadowBurst      int64
	}{
		// Same matchers: the shadow rule wins the tie (it would replace search).
		{"a", "api:search", "", "search", "search-trial", 2, 4},
		// A more specific enforced rule beats a shadow rule: nothing to trial.
		{"vip", "api:search", "", "vip", "", 0, 0},
		// Tier matcher beats a scope-only rule, shadow or not.
		{"a", "api:search", "pro", "search", "pro-trial", 50, 200},
		{"a", "web/x", "", "free", "web-trial", 1, 20},
		{"a", "other", "", "free", "", 0, 0},
	}
	for _, c := range cases {
		res, err := p.Resolve(c.key, c.scope, c.tier)
		if err != nil || res.Policy != c.enforced {
			t.Errorf("Resolve(%s,%s,%s) = %q %v, want %q", c.key, c.scope, c.tier, res.Policy, err, c.enforced)
		}
		sres, ok, err := p.ResolveShadow(c.key, c.scope, c.tier)
		if err != nil || ok != (c.shadow != "") {
			t.Errorf("ResolveShadow(%s,%s,%s): ok=%v err=%v, want %q", c.key, c.scope, c.tier, ok, err, c.shadow)
			continue
		}
		if ok && (sres.Policy != c.shadow || sres.Rate != c.shadowRate || sres.Burst != c.shadowBurst) {
			t.Errorf("ResolveShadow(%s,%s,%s) = %s %v/%d, want %s %v/%d", c.key, c.scope, c.tier,
				sres.Policy, sres.Rate, sres.Burst, c.shadow, c.shadowRate, c.shadowBurst)
		}
	}
	// The shadow limit inherits the tier's quota under the same owner, as
	// Resolve would build it (its counter lives in the shadow namespace).
	if sres, _, _ := p.ResolveShadow("a", "api:search", ""); sres.QuotaID != "tier:free" || sres.QuotaLimit != 1000 {
		t.Errorf("shadow quota: %+v", sres.Limit)
	}
	if _, ok, _ := p.ResolveShadow("a", "x", "gold"); ok {
		t.Error("an unknown tier resolved a shadow")
	}
	if w := strings.Join(p.Warnings(), "\n"); strings.Contains(w, "search-trial") {
		t.Errorf("a shadow rule sharing an enforced rule's matchers is warned about: %s", w)
	}
}

func TestShadowAndDryRunOnOneRuleAreRefused(t *testing.T) {
	_, err := Parse([]byte(`
version: 1
default_tier: free
tiers: { free: { rate: 10, burst: 20 } }
rules:
  - { name: t, scope: s, rate: 1, shadow: true, dry_run: true }
`))
	if err == nil || !strings.Contains(err.Error(), "rules[0].shadow") {
		t.Fatalf("err = %v, want a refusal naming rules[0].shadow", err)
	}
	p, err := Parse([]byte("version: 1\ndefault_tier: free\ntiers: { free: { rate: 10, burst: 20 } }\n"))
	if err != nil || p.HasShadow() {
		t.Fatalf("a file without shadow rules: HasShadow=%v err=%v", p != nil && p.HasShadow(), err)
	}
}

// explain marks shadow rules, never names one the winner, and shows the
// shadow limit beside the result.
func TestExplainShowsTheShadowBesideTheResult(t *testing.T) {
	p, err := Parse([]byte(shadowYAML))
	if err != nil {
		t.Fatal(err)
	}
	out := Explain(p, "a", "api:search", "")
	for _, want := range []string{"  s search-trial", "  * search ", "winner: search ", "shadow: search-trial rate=2/s burst=4"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	// Only a shadow rule matches: no enforced winner, no panic.
	out = Explain(p, "a", "web/x", "")
	if !strings.Contains(out, "winner: none enforced") || !strings.Contains(out, "shadow: web-trial") {
		t.Errorf("explain with only a shadow rule matching:\n%s", out)
	}
}
