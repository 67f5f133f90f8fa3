package policy_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
)

// envoyPolicy holds the three usual Envoy setups of docs/policy.md.
const envoyPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
  pro:  { rate: 100, burst: 200 }
rules:
  - name: anonymous
    key_prefix: "ip:"
    rate: 1
    burst: 5
  - name: search-per-route
    key: "global"
    scope: "route:/search"
    rate: 1000
    burst: 2000
costs: { "route:/search": 2 }
keys: { k1: pro }
domains:
  edge:
    descriptors:
      - name: per-ip
        match: [remote_address]
        key: "ip:{remote_address}"
        scope: "edge"
      - name: per-key-route
        match: [api_key, path]
        key: "{api_key}"
        scope: "route:{path}"
      - name: global-route
        match: ["generic_key=global", path]
        key: "global"
        scope: "route:{path}"
      - name: partner
        match: [partner]
        key: "partner:{partner}"
        scope: "edge"
        tier: pro
`

func TestMapDescriptor(t *testing.T) {
	p, err := policy.Parse([]byte(envoyPolicy))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		domain  string
		entries []policy.Entry
		want    policy.Mapped
		res     policy.MapResult
	}{
		{"edge", []policy.Entry{{"remote_address", "1.2.3.4"}}, policy.Mapped{Key: "ip:1.2.3.4", Scope: "edge", Index: 0, Name: "per-ip"}, policy.MapOK},
		{"edge", []policy.Entry{{"api_key", "k1"}, {"path", "/search"}}, policy.Mapped{Key: "k1", Scope: "route:/search", Index: 1, Name: "per-key-route"}, policy.MapOK},
		{"edge", []policy.Entry{{"generic_key", "global"}, {"path", "/search"}}, policy.Mapped{Key: "global", Scope: "route:/search", Index: 2, Name: "global-route"}, policy.MapOK},
		{"edge", []policy.Entry{{"partner", "acme"}}, policy.Mapped{Key: "partner:acme", Scope: "edge", Tier: "pro", Index: 3, Name: "partner"}, policy.MapOK},
		// A required value that differs, entries in another order, an extra entry: no match.
		{"edge", []policy.Entry{{"generic_key", "other"}, {"path", "/search"}}, policy.Mapped{}, policy.MapNoMatch},
		{"edge", []policy.Entry{{"path", "/search"}, {"api_key", "k1"}}, policy.Mapped{}, policy.MapNoMatch},
		{"edge", []policy.Entry{{"remote_address", "1.2.3.4"}, {"path", "/"}}, policy.Mapped{}, policy.MapNoMatch},
		{"other", []policy.Entry{{"remote_address", "1.2.3.4"}}, policy.Mapped{}, policy.MapUnknownDomain},
	}
	for _, c := range cases {
		got, res := p.MapDescriptor(c.domain, c.entries)
		if res != c.res || got != c.want {
			t.Errorf("MapDescriptor(%q, %v) = %+v, %d; want %+v, %d", c.domain, c.entries, got, res, c.want, c.res)
		}
	}
	// The mapped key and scope resolve as /check would: the per-IP
	// descriptor is the anonymous rule, the global route its own.
	for _, c := range []struct{ key, scope, policy string }{
		{"ip:1.2.3.4", "edge", "anonymous"},
		{"global", "route:/search", "search-per-route"},
		{"k1", "route:/search", "pro"},
	} {
		res, err := p.Resolve(c.key, c.scope, "")
		if err != nil || res.Policy != c.policy {
			t.Errorf("Resolve(%q, %q) = %s, %v; want %s", c.key, c.scope, res.Policy, err, c.policy)
		}
	}
}

func TestDomainValidation(t *testing.T) {
	bad := `version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
domains:
  edge:
    descriptors:
      - match: [remote_address]
        key: "ip:{remote_addr}"
        scope: "edge"
      - match: [a, a]
        key: "{a"
      - match: [remote_address]
        key: "x"
        scope: "y"
        tier: gold
  empty: {}
`
	_, err := policy.Parse([]byte(bad))
	if err == nil {
		t.Fatal("a bad domains section was accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"domains.edge.descriptors[0].key (line 9): {remote_addr} is not an entry key of match",
		`domains.edge.descriptors[1].match[1] (line 11): entry key "a" is listed twice`,
		`domains.edge.descriptors[1].key (line 12): has a { that is not closed`,
		"domains.edge.descriptors[1].scope (line 11): is required",
		"domains.edge.descriptors[2].match (line 13): is the same as descriptors[0]'s",
		`domains.edge.descriptors[2].tier (line 16): names tier "gold", which is not defined`,
		"domains.empty.descriptors (line 17): at least one descriptor mapping is required",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	// Unknown fields are refused with the field list, like everywhere else.
	_, err = policy.Parse([]byte(strings.Replace(bad, "  empty: {}", "  other:\n    descriptors:\n      - { match: [a], key: k, scope: s, cost: 3 }", 1)))
	if err == nil || !strings.Contains(err.Error(), "domains.other.descriptors[0].cost (line 19): unknown field") {
		t.Errorf("unknown field: %v", err)
	}
}

func TestExplainDescriptor(t *testing.T) {
	p, err := policy.Parse([]byte(envoyPolicy))
	if err != nil {
		t.Fatal(err)
	}
	out := policy.ExplainDescriptor(p, "edge", []policy.Entry{{"remote_address", "1.2.3.4"}})
	for _, want := range []string{"mapping: domains.edge.descriptors[0] per-ip", `key   "ip:1.2.3.4"`, "winner: anonymous", "burst=5"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	out = policy.ExplainDescriptor(p, "edge", []policy.Entry{{"user", "u"}})
	if !strings.Contains(out, "no mapping matches") || !strings.Contains(out, "OK with no limit") {
		t.Errorf("no match explained as:\n%s", out)
	}
	out = policy.ExplainDescriptor(p, "nope", nil)
	if !strings.Contains(out, `unknown domain: the file defines "edge"`) {
		t.Errorf("unknown domain explained as:\n%s", out)
	}
}
