package usage

import (
	"log/slog"
	"testing"
)

// TestUsageUnits: each named scope of a usage answer carries the unit its
// policy names; scopes without one, and the all-scopes sum, carry none.
func TestUsageUnits(t *testing.T) {
	path := t.TempDir() + "/policy.yaml"
	writeFile(t, path, `version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
  llm:  { rate: 100000, period: minute, burst: 100000, unit: tokens }
rules:
  - { name: scans, scope: "db:*", unit: bytes }
keys: { acct_llm: llm }
`)
	s := &Server{log: slog.New(slog.DiscardHandler)}
	if got := s.units("acct_llm", []seriesPoint{{Scope: "llm:tokens"}}); got != nil {
		t.Fatalf("without a policy: %v", got)
	}
	s.policy = newPolicy(path, s)
	got := s.units("acct_llm", []seriesPoint{{Scope: "llm:tokens"}, {Scope: "db:scan"}, {Scope: "llm:tokens"}, {Scope: AllScopes}})
	if len(got) != 2 || got["llm:tokens"] != "tokens" || got["db:scan"] != "bytes" {
		t.Fatalf("units %v", got)
	}
	if got := s.units("acct_free", []seriesPoint{{Scope: "api"}}); got != nil {
		t.Fatalf("a scope whose policy names no unit: %v", got)
	}
}
