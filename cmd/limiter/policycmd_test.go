package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// policyCommand runs `limiter policy ARGS...` through the limiter's command
// table and returns the exit code.
func policyCommand(args []string, stdout, stderr io.Writer) int {
	return program().Main(append([]string{"policy"}, args...), stdout, stderr)
}

func runPolicy(args ...string) (code int, stdout, stderr string) {
	var out, errOut strings.Builder
	code = policyCommand(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestPolicyCheck(t *testing.T) {
	code, out, errOut := runPolicy("check", "../../deploy/policy.yaml")
	if code != 0 || !strings.Contains(out, "ok: ../../deploy/policy.yaml is valid (version 1, 3 tiers, 5 rules, sha256 ") || errOut != "" {
		t.Fatalf("check deploy/policy.yaml: exit %d\n%s%s", code, out, errOut)
	}

	// Valid but suspicious: exit 0, with the warning.
	code, out, _ = runPolicy("check", "../../policy/testdata/resolve.yaml")
	if code != 0 || !strings.Contains(out, `warning: rules[7] "pro-search-dup" can never win`) {
		t.Fatalf("check with a shadowed rule: exit %d\n%s", code, out)
	}

	broken := filepath.Join(t.TempDir(), "broken.yaml")
	src := `version: 1
default_tier: gold
tiers:
  free: { rate: 10, brust: 20 }
rules:
  - name: search
    scope: "api:search"
    rate: fast
`
	if err := os.WriteFile(broken, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runPolicy("check", broken)
	if code == 0 || out != "" {
		t.Fatalf("a broken file passed: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		"policy refused:",
		`default_tier (line 2): names tier "gold", which is not defined`,
		"tiers.free.brust (line 4): unknown field",
		`rules[0].rate (line 8): must be a number, got "fast"`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}

	if code, _, errOut := runPolicy("check", filepath.Join(t.TempDir(), "missing.yaml")); code == 0 || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing file: exit %d %s", code, errOut)
	}
}

func TestPolicyExplain(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"explain", "../../deploy/policy.yaml", "--key", "acct_demo_pro", "--scope", "api:search"}, []string{
			"tier: pro (from the keys map)",
			"* pro-search",
			"winner: pro-search",
			"result: policy=pro-search rate=50/s burst=100 cost=10 soft_limit=80% dry_run=true",
			"quota       none",
			"rule pro-search is in dry run",
		}},
		// Flags may come first; the tier flag overrides the keys map.
		{[]string{"explain", "--key", "acct_demo_pro", "--scope", "api:search", "--tier", "enterprise", "../../deploy/policy.yaml"}, []string{
			"tier: enterprise (given with the request)",
			"rules matched: none; the tier's own limit applies",
			"result: policy=enterprise rate=5000/s burst=10000 cost=10 quota=100000000/month",
		}},
		// An anonymous export: key_prefix beats a key-less glob scope.
		{[]string{"explain", "../../deploy/policy.yaml", "--key", "ip:203.0.113.7", "--scope", "api:export/csv"}, []string{
			"tier: free (default_tier",
			"    exports",
			"  * anonymous",
			"winner: anonymous",
			"result: policy=anonymous rate=1/s burst=5 cost=1 quota=100000/day soft_limit=80%",
			`counter "tier:free" (tier free)`,
		}},
		{[]string{"explain", "../../deploy/policy.yaml", "--key", "acct_1", "--scope", "api:export"}, []string{
			"winner: exports",
			"result: policy=exports rate=0.5/s burst=10 cost=1",
		}},
	}
	for _, c := range cases {
		code, out, errOut := runPolicy(c.args...)
		if code != 0 {
			t.Errorf("%v: exit %d %s", c.args, code, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

func TestPolicyCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"check"},
		{"lint", "../../deploy/policy.yaml"},
		{"explain", "../../deploy/policy.yaml", "--scope", "s"},         // no key
		{"explain", "../../deploy/policy.yaml", "--key", "k"},           // no scope
		{"explain", "a.yaml", "b.yaml", "--key", "k", "--scope", "s"},   // two files
		{"check", "../../deploy/policy.yaml", "--key", "k"},             // check takes no flags
		{"explain", "../../deploy/policy.yaml", "--nope", "--key", "k"}, // unknown flag
	} {
		code, _, errOut := runPolicy(args...)
		if code != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 with usage", args, code, errOut)
		}
	}
	if code, _, errOut := runPolicy("explain", "../../deploy/policy.yaml", "--key", "k", "--scope", "s", "--tier", "gold"); code != 1 ||
		!strings.Contains(errOut, `unknown tier "gold"`) {
		t.Errorf("unknown tier: exit %d %s", code, errOut)
	}
}
