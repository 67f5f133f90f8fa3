package policy_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ratewarden/ratewarden/policy"
)

// File is the policy as yaml.v3 alone reads it (the fuzz test's reference).
type File = policy.File

const validHead = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 5 }\n"

// TestParseRefusals: each broken file is refused with every reason, each
// naming the field's path and line.
func TestParseRefusals(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string // substrings of the error, all required
	}{
		{"empty", "", []string{"policy file is empty"}},
		{"comments only", "# nothing\n", []string{"policy file is empty"}},
		{"not YAML", "version: [1\n", []string{"not valid YAML", "line"}},
		{"two documents", validHead + "---\nversion: 1\n", []string{"more than one YAML document"}},
		{"not a mapping", "- 1\n", []string{"policy (line 1): must be a mapping"}},
		{"wrong version", "version: 2\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 5 }\n", []string{"version (line 1): must be 1, got 2"}},
		{"unknown top-level field", validHead + "limits: {}\n", []string{"limits (line 5): unknown field"}},
		{"unknown tier field (typo)", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, brust: 5 }\n",
			[]string{"tiers.free.brust (line 4): unknown field", "tiers.free.burst (line 4): must be between 1 and 2^50, got 0"}},
		{"duplicate key", "version: 1\nversion: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 5 }\n", []string{"version (line 2): is defined twice (first at line 1)"}},
		{"wrong type", "version: 1\ndefault_tier: free\ntiers:\n  free:\n    rate: ten\n    burst: 5\n", []string{`tiers.free.rate (line 5): must be a number, got "ten"`}},
		{"fractional burst", "version: 1\ndefault_tier: free\ntiers:\n  free:\n    rate: 1\n    burst: 2.5\n", []string{`tiers.free.burst (line 6): must be a whole number, got "2.5"`}},
		{"dry_run maybe", validHead + "dry_run: maybe\n", []string{`dry_run (line 5): must be true or false, got "maybe"`}},
		{"quoted number", validHead + "costs: { x: \"5\" }\n", []string{`costs.x (line 5): must be a whole number, got "5"`}},
		{"rules not a list", validHead + "rules: { name: x }\n", []string{"rules (line 5): must be a list, got a mapping"}},
		{"missing default tier", "version: 1\ntiers:\n  free: { rate: 1, burst: 5 }\n", []string{"default_tier: is required"}},
		{"undefined default tier", "version: 1\ndefault_tier: gold\ntiers:\n  free: { rate: 1, burst: 5 }\n", []string{`default_tier (line 2): names tier "gold", which is not defined`}},
		{"no tiers", "version: 1\ndefault_tier: free\n", []string{"tiers: at least one tier is required"}},
		{"bad rate and period", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 0, period: week, burst: 5 }\n",
			[]string{"tiers.free.rate (line 4): must be > 0, got 0", `tiers.free.period (line 4): must be second, minute, hour or day, got "week"`}},
		{"negative rate NaN soft", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: -1, burst: 5, soft_limit_percent: .nan }\n",
			[]string{"tiers.free.rate (line 4): must be > 0, got -1", "tiers.free.soft_limit_percent (line 4): must be between 0 and 100, got NaN"}},
		{"infinite rate", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: .inf, burst: 5 }\n", []string{"tiers.free.rate (line 4): must be > 0, got +Inf"}},
		{"quota", "version: 1\ndefault_tier: free\ntiers:\n  free:\n    rate: 1\n    burst: 5\n    quota: { limit: 0, period: week }\n",
			[]string{"tiers.free.quota.limit (line 7): must be between 1 and 2^50, got 0", `tiers.free.quota.period (line 7): must be hour, day or month, got "week"`}},
		{"keys map to an unknown tier", validHead + "keys:\n  acct_1: gold\n", []string{`keys.acct_1 (line 6): names tier "gold", which is not defined`}},
		{"negative cost", validHead + "costs:\n  api:search: -1\n", []string{"costs.api:search (line 6): must be between 0 and 1000000000, got -1"}},
		{"ceiling", validHead + "global_ceiling: { rate: 0 }\n", []string{"global_ceiling.rate (line 5): must be > 0", "global_ceiling.burst (line 5): must be between 1 and 2^50, got 0"}},
		{"rule problems", validHead + `rules:
  - name: a
    key: k
    key_prefix: "k"
    tier: gold
  - name: a
    period: minute
    burst: 0
    split: 5000
  - scope: x
    soft_limit_percent: 101
    quota: { limit: 1 }
`, []string{
			"rules[0] (line 6): key and key_prefix cannot both be set",
			`rules[0].tier (line 9): names tier "gold", which is not defined`,
			`rules[1].name (line 10): "a" is already the name of rules[0]`,
			"rules[1].period (line 11): is set without rate",
			"rules[1].burst (line 12): must be between 1 and 2^50, got 0",
			"rules[1].split (line 13): must be between 0 and 1024, got 5000",
			"rules[2].name (line 14): is required",
			"rules[2].soft_limit_percent (line 15): must be between 0 and 100, got 101",
			`rules[2].quota.period (line 16): must be hour, day or month, got ""`,
		}},
		{"refill longer than ten years", "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, period: day, burst: 10000 }\n",
			[]string{"tiers.free (line 4): burst 10000 at 1.16e-05 tokens/s takes 27.4 years to refill"}},
		{"a rule's refill under the ceiling", validHead + "global_ceiling: { rate: 1, period: day, burst: 5000 }\nrules:\n  - { name: r, burst: 5000 }\n",
			[]string{"rules[0] (line 7): burst 5000 at 1.16e-05 tokens/s takes 13.7 years"}},
		{"aliases that expand without end", "version: 1\ntiers: &t { <<: *t }\n", []string{"expands to more than"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := policy.Parse([]byte(c.src))
			if err == nil {
				t.Fatalf("accepted: %+v", p.File())
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestParseReportsInFileOrderAndBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(validHead + "rules:\n")
	for i := 0; i < 200; i++ {
		fmt.Fprintf(&b, "  - { name: r%d, burst: 0 }\n", i)
	}
	_, err := policy.Parse([]byte(b.String()))
	if err == nil {
		t.Fatal("accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 51 || !strings.Contains(lines[50], "more problems") {
		t.Fatalf("%d lines, last %q; want 50 problems and a count of the rest", len(lines), lines[len(lines)-1])
	}
	if !strings.HasPrefix(lines[0], "rules[0].burst (line 6)") || !strings.HasPrefix(lines[1], "rules[1].burst (line 7)") {
		t.Fatalf("not in file order: %q, %q", lines[0], lines[1])
	}
}

func TestParseAcceptsAnchorsAndMerges(t *testing.T) {
	p := parse(t, `
version: 1
default_tier: free
tiers:
  free: &base { rate: 1, burst: 5, soft_limit_percent: 50 }
  more: { <<: *base, burst: 9 }
`)
	res, err := p.Resolve("k", "s", "more")
	if err != nil || res.Rate != 1 || res.Burst != 9 || res.SoftLimitPercent != 50 {
		t.Fatalf("%+v %v", res, err)
	}
}

// TestKeysAndCostsMaps: the two maps that may be large are decoded by hand
// (linear time); they keep YAML's meaning, anchors and merges included.
func TestKeysAndCostsMaps(t *testing.T) {
	p := parse(t, `
version: 1
default_tier: free
tiers: { free: { rate: 1, burst: 50 }, pro: { rate: 2, burst: 50 } }
keys:
  <<: { acct_a: pro, acct_b: pro }
  acct_b: free
  acct_c: &t pro
  acct_d: *t
costs: { "api:search": 10, health: 0 }
`)
	want := map[string]string{"acct_a": "pro", "acct_b": "free", "acct_c": "pro", "acct_d": "pro", "acct_e": "free"}
	for key, tier := range want {
		if res, err := p.Resolve(key, "s", ""); err != nil || res.Tier != tier {
			t.Errorf("%s: tier %q (err %v), want %q", key, res.Tier, err, tier)
		}
	}
	for scope, cost := range map[string]int64{"api:search": 10, "health": 0, "other": 1} {
		if res, _ := p.Resolve("k", scope, ""); res.Cost != cost {
			t.Errorf("cost of %s = %d, want %d", scope, res.Cost, cost)
		}
	}
	_, err := policy.Parse([]byte(validHead + "keys:\n  acct_1: free\n  acct_1: free\n"))
	if err == nil || !strings.Contains(err.Error(), "keys.acct_1 (line 7): is defined twice (first at line 6)") {
		t.Errorf("duplicate key in keys: %v", err)
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("version: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := policy.Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "version (line 1)") {
		t.Fatalf("err = %v", err)
	}
	if _, err := policy.Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

func TestParseRefusesOversizedFile(t *testing.T) {
	_, err := policy.Parse(make([]byte, policy.MaxFileSize+1))
	if err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzParse: no input panics; a refusal always says why; an accepted policy
// resolves to a usable limit (rate > 0, burst ≥ 1) or to ErrUnknownTier.
// Seeds: testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, path := range []string{"testdata/resolve.yaml", "../deploy/policy.yaml"} {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := policy.Parse(b)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("refused without a message: %q", b)
			}
			return
		}
		fl := p.File()
		// The hand-decoded maps mean what yaml.v3 would have made of them.
		var ref File
		if err := unmarshalNoPanic(b, &ref); err != nil {
			t.Fatalf("accepted, but yaml.v3 refuses it: %v", err)
		}
		if !maps.Equal(ref.Keys, fl.Keys) || !maps.Equal(ref.Costs, fl.Costs) {
			t.Fatalf("keys %v costs %v; yaml.v3 reads keys %v costs %v", fl.Keys, fl.Costs, ref.Keys, ref.Costs)
		}
		for _, probe := range [][3]string{{"k", "s", ""}, {"ip:1", "api:search", ""}, {"acct_8812", "health", fl.DefaultTier}} {
			res, err := p.Resolve(probe[0], probe[1], probe[2])
			if err != nil {
				t.Fatalf("Resolve%v of an accepted policy: %v", probe, err)
			}
			if !(res.Rate > 0) || res.Burst < 1 || res.Cost < 0 {
				t.Fatalf("Resolve%v = %+v: not a usable limit", probe, res)
			}
			_ = policy.Explain(p, probe[0], probe[1], probe[2])
		}
		for _, r := range fl.Rules {
			if _, err := p.Resolve(r.Key+r.KeyPrefix+"x", r.Scope, r.Tier); err != nil {
				t.Fatalf("Resolve for rule %q: %v", r.Name, err)
			}
		}
	})
}

func unmarshalNoPanic(b []byte, v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml.v3 panicked: %v", r)
		}
	}()
	return yaml.Unmarshal(b, v)
}
