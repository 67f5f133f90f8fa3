package support_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/support"
)

// TestRuleNamesTheOverride: under the policy log's overrides, the rule
// inspect shows is the override's limit, and names the override and the
// revision, and who set it and why, as the limiter keeps them.
func TestRuleNamesTheOverride(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 5 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	doc, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ov := policy.NewOverrides(1)
	ov.PutTagged(policy.OverrideKey{Key: "acct_vip"}, policy.Override{Rate: 10, Burst: 100, Reason: "contract 77"}, policy.OverrideTag{Revision: 42, Author: "alice/billing", Reason: "contract 77", Message: "Q4 deals"})
	p := policy.NewWithOverrides(doc, ov, nil)

	r, err := support.RuleFor(p, "acct_vip", "api")
	if err != nil {
		t.Fatal(err)
	}
	if r.Limit.Burst != 100 || r.Override == nil || r.Override.Revision != 42 || r.Override.Key != "acct_vip" ||
		r.Override.Author != "alice/billing" || r.Override.Reason != "contract 77" || r.Override.Message != "Q4 deals" ||
		!strings.Contains(r.Explain, "revision 42") || !strings.Contains(r.Explain, "alice/billing") {
		t.Fatalf("rule %+v (override %+v), want the override's burst 100 from revision 42", r, r.Override)
	}
	r, err = support.RuleFor(p, "acct_other", "api")
	if err != nil {
		t.Fatal(err)
	}
	if r.Limit.Burst != 5 || r.Override != nil || r.Explain == "" {
		t.Fatalf("rule of a key without override: %+v", r)
	}
}
