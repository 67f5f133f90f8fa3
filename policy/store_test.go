package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

// TestKeyAndTierStores: a key's entry may name its tier alone or its tier
// and store; a tier may name a store; the key's own store wins.
func TestKeyAndTierStores(t *testing.T) {
	p, err := policy.Parse([]byte(`
version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 1 }
  enterprise: { rate: 100, burst: 100, store: big }
keys:
  acct_plain: enterprise
  acct_acme: { tier: enterprise, store: acme }
  acct_free_here: { tier: free }
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, tier, store string }{
		{"acct_plain", "enterprise", "big"},
		{"acct_acme", "enterprise", "acme"},
		{"acct_free_here", "free", ""},
		{"unknown", "free", ""},
	} {
		res, err := p.Resolve(c.key, "api", "")
		if err != nil {
			t.Fatal(err)
		}
		if res.Tier != c.tier || res.Store != c.store {
			t.Errorf("%s: tier %q store %q, want %q %q", c.key, res.Tier, res.Store, c.tier, c.store)
		}
	}
	// The key's store holds whatever tier the request names.
	if res, _ := p.Resolve("acct_acme", "api", "free"); res.Store != "acme" {
		t.Errorf("acct_acme with tier free: store %q, want acme", res.Store)
	}
	if got := strings.Join(p.Stores(), ","); got != "acme,big" {
		t.Errorf("Stores() = %s", got)
	}
	known := func(n string) bool { return n == "acme" }
	err = p.CheckStores(known)
	if err == nil || !strings.Contains(err.Error(), `tiers.enterprise.store: names store "big"`) || strings.Contains(err.Error(), `"acme"`) {
		t.Fatalf("CheckStores with only acme configured: %v", err)
	}
	if err := p.CheckStores(func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
}

func TestBadStoreNames(t *testing.T) {
	_, err := policy.Parse([]byte(`
version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 1, store: "no spaces" }
keys:
  a: { tier: free, store: default }
  b: { tier: nope, store: x }
  c: { tier: free, shard: x }
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		`tiers.free.store (line 5): "no spaces" is not a store name`,
		`keys.a.store (line 7): "default" is not a store name`,
		`keys.b (line 8): names tier "nope"`,
		`keys.c.shard (line 9): unknown field`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}
