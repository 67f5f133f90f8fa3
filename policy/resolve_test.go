package policy_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
)

func load(t testing.TB, path string) *policy.Policy {
	t.Helper()
	p, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func parse(t testing.TB, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, src)
	}
	return p
}

// TestResolutionOrder walks every step of the documented order with
// testdata/resolve.yaml: the tier (request, keys map, default_tier), the
// rule (exact key > key_prefix > tier > none; exact scope > glob > none;
// ties to the first listed; no rule → the tier), the fields a rule leaves
// out (inherited from the tier), costs, dry run, and the global ceiling.
func TestResolutionOrder(t *testing.T) {
	p := load(t, "testdata/resolve.yaml")
	free := enforcement.Limit{Rate: 10, Burst: 20}
	pro := enforcement.Limit{Rate: 100, Burst: 200, SoftLimitPercent: 80}
	// ent's own 5000/s and 10000 are capped by global_ceiling.
	ent := enforcement.Limit{Rate: 1000, Burst: 1500, QuotaLimit: 1_000_000, QuotaPeriod: enforcement.PeriodMonth, QuotaID: "tier:ent"}
	with := func(l enforcement.Limit, rate float64, burst int64) enforcement.Limit {
		l.Rate = rate
		if burst != 0 {
			l.Burst = burst
		}
		return l
	}
	cases := []struct {
		step             string
		key, scope, tier string
		policy, wantTier string
		limit            enforcement.Limit
		cost             int64
		dryRun           bool
	}{
		// 1. The tier.
		{"tier from the request", "nobody", "web", "pro", "pro-tier", "pro", with(pro, 101, 0), 1, false},
		{"tier from the keys map", "acct_pro", "web", "", "pro-tier", "pro", with(pro, 101, 0), 1, false},
		{"the request's tier beats the keys map", "acct_pro", "web", "free", "free", "free", free, 1, false},
		{"default_tier", "nobody", "web", "", "free", "free", free, 1, false},
		// 2. The key matcher: exact key > key_prefix > tier > none.
		{"exact key beats key_prefix", "ip:9.9.9.9", "web", "", "exact-ip", "free", with(free, 4, 0), 1, false},
		{"exact key (no scope) beats key_prefix with a scope", "ip:9.9.9.9", "api:export/csv", "", "exact-ip", "free", with(free, 4, 0), 1, false},
		{"key_prefix beats tier", "ip:1.1.1.1", "web", "pro", "prefix", "pro", with(pro, 1, 5), 1, false},
		{"key_prefix (no scope) beats a key-less exact scope", "ip:1.1.1.1", "api:search", "", "prefix", "free", with(free, 1, 5), 10, false},
		{"tier (no scope) beats a tier-less exact scope", "nobody", "health", "pro", "pro-tier", "pro", with(pro, 101, 0), 0, false},
		{"tier rule beats key-less rules", "nobody", "api:other", "pro", "pro-glob", "pro", with(pro, 102, 0), 1, false},
		// 3. The scope within one key rank: exact > glob > none.
		{"exact scope beats glob (key-less)", "nobody", "api:search", "", "any-search", "free", with(free, 8, 0), 10, false},
		{"glob scope beats no rule", "nobody", "api:seaweed", "", "glob-search", "free", with(free, 7, 0), 1, false},
		{"exact scope beats glob (tier)", "acct_pro", "api:search", "", "pro-search", "pro", with(pro, 103, 0), 10, true},
		{"glob beats no scope (tier)", "acct_pro", "api:list", "", "pro-glob", "pro", with(pro, 102, 0), 1, false},
		{"no scope (tier)", "acct_pro", "web", "", "pro-tier", "pro", with(pro, 101, 0), 1, false},
		{"glob beats no scope (key_prefix); period minute", "ip:1.1.1.1", "api:export/csv", "", "prefix-export", "free", with(free, 0.5, 0), 1, false},
		{"exact scope beats no scope (exact key)", "acct_vip", "api:search", "", "exact-key-search", "ent", with(ent, 3, 0), 10, false},
		// 4. Ties go to the rule listed first.
		{"tie between globs: first listed", "nobody", "api:seaside", "", "glob-search", "free", with(free, 7, 0), 1, false},
		{"the second glob where the first does not match", "nobody", "api:sort", "", "glob-search-2", "free", with(free, 9, 0), 1, false},
		{"tie between identical rules: first listed", "nobody", "api:search", "pro", "pro-search", "pro", with(pro, 103, 0), 10, true},
		// 5. No rule: the tier's own limit, named after the tier.
		{"no rule matches", "nobody", "web", "", "free", "free", free, 1, false},
		{"no rule matches, tier with quota", "acct_other", "web", "ent", "ent", "ent", ent, 1, false},
		// 6. The global ceiling caps rate and burst of whatever resolved;
		// the rule's quota and soft limit replace the tier's.
		{"ceiling caps a rule", "acct_vip", "web", "", "exact-key", "ent",
			enforcement.Limit{Rate: 1000, Burst: 1500, SoftLimitPercent: 50, QuotaLimit: 10, QuotaPeriod: enforcement.PeriodDay, QuotaID: "rule:exact-key"}, 1, false},
		// 7. Costs per scope: listed, zero, default 1.
		{"cost of a listed scope", "nobody", "api:search", "free", "any-search", "free", with(free, 8, 0), 10, false},
		{"cost zero", "nobody", "health", "free", "any-health", "free", with(free, 6, 0), 0, false},
	}
	for _, c := range cases {
		t.Run(c.step, func(t *testing.T) {
			got, err := p.Resolve(c.key, c.scope, c.tier)
			if err != nil {
				t.Fatal(err)
			}
			want := enforcement.Resolved{Limit: c.limit, Policy: c.policy, Tier: c.wantTier, Cost: c.cost, DryRun: c.dryRun}
			if got != want {
				t.Errorf("Resolve(%q, %q, %q)\n got %+v\nwant %+v", c.key, c.scope, c.tier, got, want)
			}
			winner, _ := p.Matches(c.key, c.scope, c.tier)
			if name := tierOrRule(winner, got.Tier); name != c.policy {
				t.Errorf("Matches winner %q, Resolve says %q", name, c.policy)
			}
		})
	}
}

func tierOrRule(r *policy.Rule, tier string) string {
	if r == nil {
		return tier
	}
	return r.Name
}

func TestUnknownTier(t *testing.T) {
	p := load(t, "testdata/resolve.yaml")
	_, err := p.Resolve("k", "s", "platinum")
	if !errors.Is(err, enforcement.ErrUnknownTier) || !strings.Contains(err.Error(), "platinum") {
		t.Fatalf("err = %v, want ErrUnknownTier naming the tier", err)
	}
}

func TestMatchesListsEveryMatchInFileOrder(t *testing.T) {
	p := load(t, "testdata/resolve.yaml")
	winner, matched := p.Matches("acct_pro", "api:search", "")
	var names []string
	for _, r := range matched {
		names = append(names, r.Name)
	}
	want := "glob-search glob-search-2 any-search pro-tier pro-glob pro-search pro-search-dup"
	if strings.Join(names, " ") != want || winner == nil || winner.Name != "pro-search" {
		t.Fatalf("matched %v winner %v, want [%s] winner pro-search", names, winner, want)
	}
}

func TestTopLevelDryRun(t *testing.T) {
	p := parse(t, `
version: 1
default_tier: free
dry_run: true
tiers: { free: { rate: 1, burst: 2 } }
rules: [ { name: r, scope: s, rate: 5 } ]
`)
	for _, scope := range []string{"s", "other"} {
		res, err := p.Resolve("k", scope, "")
		if err != nil || !res.DryRun {
			t.Errorf("scope %s: DryRun = %v (err %v), want true for every decision", scope, res.DryRun, err)
		}
	}
}

func TestCeilingNeverRaises(t *testing.T) {
	p := parse(t, `
version: 1
default_tier: free
global_ceiling: { rate: 6000, period: minute, burst: 15 }
tiers: { free: { rate: 1, burst: 20 }, big: { rate: 500, burst: 10 } }
`)
	res, _ := p.Resolve("k", "s", "free")
	if res.Rate != 1 || res.Burst != 15 {
		t.Errorf("free: rate %v burst %d, want 1 (below the ceiling's 100/s) and 15 (capped)", res.Rate, res.Burst)
	}
	res, _ = p.Resolve("k", "s", "big")
	if res.Rate != 100 || res.Burst != 10 {
		t.Errorf("big: rate %v burst %d, want 100 (6000/minute) and 10", res.Rate, res.Burst)
	}
}

func TestVersionHashFile(t *testing.T) {
	b, err := os.ReadFile("testdata/resolve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p1, p2 := parse(t, string(b)), parse(t, string(b)+"\n# a comment changes the hash\n")
	if p1.Version() != 1 || len(p1.Hash()) != 64 || p1.Hash() == p2.Hash() {
		t.Fatalf("version %d hash %q / %q", p1.Version(), p1.Hash(), p2.Hash())
	}
	if f := p1.File(); len(f.Rules) != 13 || f.DefaultTier != "free" {
		t.Fatalf("File() = %d rules, default %q", len(f.Rules), f.DefaultTier)
	}
}

func TestDeployPolicyIsValid(t *testing.T) {
	p := load(t, "../deploy/policy.yaml")
	res, err := p.Resolve("acct_demo_pro", "api:search", "")
	if err != nil || res.Policy != "pro-search" || !res.DryRun || res.Cost != 10 {
		t.Fatalf("deploy policy, pro search: %+v %v", res, err)
	}
}

func TestWarnings(t *testing.T) {
	p := load(t, "testdata/resolve.yaml")
	w := p.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], `rules[7] "pro-search-dup" can never win: "pro-search" has the same matchers`) {
		t.Fatalf("warnings %q", w)
	}
	p = parse(t, validWarnHead+"costs: { big: 600, ok: 500 }\n")
	if w := p.Warnings(); len(w) != 1 || !strings.Contains(w[0], `costs["big"] = 600 exceeds every burst (at most 500)`) {
		t.Fatalf("warnings %q", w)
	}
	if w := load(t, "../deploy/policy.yaml").Warnings(); len(w) != 0 {
		t.Fatalf("deploy/policy.yaml: %q", w)
	}
}

const validWarnHead = "version: 1\ndefault_tier: free\nglobal_ceiling: { rate: 10, burst: 500 }\ntiers:\n  free: { rate: 1, burst: 5 }\n  big: { rate: 1, burst: 1000 }\n"
