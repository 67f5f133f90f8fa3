package deploytest

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/repo"
)

// conditional are metrics that are declared in the code but whose series
// appear on /metrics only after an event this test does not cause (a
// labelled counter gets its first child on the first increment). Each must
// still be declared in the Go sources; once a scrape shows one, the test
// says so and it can leave this list.
var conditional = map[string]string{
	"limiter_slot_decisions_total":         "labelled by outcome, priority and source: appears with the first /check on a concurrency limit (docs/concurrency.md)",
	"limiter_slot_returns_total":           "labelled by outcome: appears with the first /release or /renew",
	"limiter_region_decisions_total":       "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_global_up":             "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_home_errors_total":     "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_home_rtt_seconds":      "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_leased_tokens_total":   "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_pool_errors_total":     "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_pool_tokens":           "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"limiter_region_returned_tokens_total": "a limiter started as a region (LIMITER_REGION set; enforcement/global)",
	"meter_insert_errors_total":            "labelled by table; the first child appears with the first failed INSERT",
	"notifier_attempts_total":              "the soft-limit notifier (consumer group notifier) in meter-consumer; labelled by outcome, appears with the first webhook attempt",
	"notifier_notifications_total":         "the soft-limit notifier in meter-consumer; labelled by result",
	"notifier_deliveries_in_flight":        "the soft-limit notifier in meter-consumer",
	"limiter_shadow_decisions_total":       "labelled by shadow rule; the first child appears with the first shadow verdict (a policy with a shadow rule, or LIMITER_SHADOW_POLICY_FILE)",
	"meter_rollout_judge_leader":           "the rollout judge in meter-consumer, with POLICY_JUDGE=true",
	"meter_rollout_verdicts_total":         "the rollout judge in meter-consumer, with POLICY_JUDGE=true",
	"meter_rollout_overdue_seconds":        "the rollout judge in meter-consumer, with POLICY_JUDGE=true",
	"meter_rollout_newly_rejected_ratio":   "the rollout judge in meter-consumer, with POLICY_JUDGE=true",
}

// synthesized are series Prometheus makes itself.
var synthesized = map[string]bool{"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true}

var (
	quoted     = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	braces     = regexp.MustCompile(`\{[^{}]*\}`)
	brackets   = regexp.MustCompile(`\[[^\]]*\]`)
	grouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	keywords   = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects:
// identifiers that are not functions, keywords, label names (in matchers or
// grouping lists), durations or parts of numbers.
func metricNames(expr string) []string {
	s := quoted.ReplaceAllString(expr, `""`)
	for braces.MatchString(s) {
		s = braces.ReplaceAllString(s, " ")
	}
	s = brackets.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range identifier.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if keywords[strings.ToLower(name)] {
			continue
		}
		if loc[0] > 0 {
			if prev := s[loc[0]-1]; prev >= '0' && prev <= '9' || prev == '.' || prev == '$' {
				continue // 1e-9, 5m, $variable
			}
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or aggregation
		}
		out = append(out, name)
	}
	return out
}

func TestBalanced(t *testing.T) {
	for expr, want := range map[string]string{
		`sum(rate(a[5m])) > 0`:         "",
		`sum(rate(a{b="(("}[5m])) > 0`: "",
		`sum(rate(a[5m]) > 0`:          "unclosed (",
		`sum(rate(a{b="c"]))`:          "unbalanced ]",
	} {
		if got := balanced(expr); got != want {
			t.Errorf("balanced(%q) = %q, want %q", expr, got, want)
		}
	}
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (instance) (rate(limiter_shared_unavailable_total[2m])) > 0`:                                        "limiter_shared_unavailable_total",
		`histogram_quantile(0.99, sum by (le) (rate(x_bucket{a="b", c=~"d|e"}[5m]))) > 1e-3`:                        "x_bucket",
		`sum(rate(a_total{result="rejected",instance=~"$instance"}[1m])) / clamp_min(sum(rate(b_total[1m])), 1e-9)`: "a_total b_total",
		`up{job=~"limiter|meter"} == 0 and on(instance) c offset 5m`:                                                "up c",
		`max by (instance) (limiter_breaker_state) >= 2`:                                                            "limiter_breaker_state",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

var declared = regexp.MustCompile(`(?:Name:\s*|NewDesc\(|promdecl\.[A-Za-z]+\(\s*)"([a-zA-Z_:][a-zA-Z0-9_:]*)"`)

// declaredNames are the metric names declared in the non-test Go sources.
func declaredNames(t *testing.T) map[string]bool {
	out := map[string]bool{}
	root := repo.Root(t)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "run" || d.Name() == ".git" || d.Name() == "testdata-artifacts") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range declared.FindAllSubmatch(raw, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func checkMetrics(t *testing.T, s *stack) {
	exported := map[string]bool{}
	for _, u := range []string{s.limiter, s.meter, s.usage} {
		for n := range scrapeNames(t, u+"/metrics") {
			exported[n] = true
		}
	}
	decl := declaredNames(t)
	known := func(n string) bool {
		if exported[n] || synthesized[n] {
			return true
		}
		if _, ok := conditional[n]; ok && decl[n] {
			return true
		}
		return false
	}
	for n, why := range conditional {
		if !decl[n] {
			t.Errorf("conditional metric %s is not declared in the Go sources", n)
		}
		if exported[n] {
			t.Logf("%s is exported now (%s): it can leave the conditional list", n, why)
		}
	}

	// Alert and recording rules.
	files, err := filepath.Glob(filepath.Join(repo.Root(t), "deploy", "prometheus", "rules", "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule files: %v", err)
	}
	// Prometheus loads the rule files prometheus.yml lists; rules/ also
	// holds promtool unit tests (*_test.yml), which are not rule files.
	listed := map[string]bool{}
	for _, cfg := range []string{"prometheus.yml", "prometheus-k8s.yml"} {
		prom := yamlDocs(t, filepath.Join(repo.Root(t), "deploy", "prometheus", cfg))[0]
		got := map[string]bool{}
		for _, rf := range asList(prom["rule_files"]) {
			base := filepath.Base(asString(rf))
			got[base] = true
			if _, err := os.Stat(filepath.Join(repo.Root(t), "deploy", "prometheus", "rules", base)); err != nil {
				t.Errorf("%s lists rule file %s: %v", cfg, rf, err)
			}
		}
		if len(listed) > 0 && fmt.Sprint(got) != fmt.Sprint(listed) {
			t.Errorf("%s loads %v, prometheus.yml loads %v", cfg, got, listed)
		}
		listed = got
	}
	type rule struct{ file, name, expr string }
	var rules []rule
	recorded := map[string]bool{}
	for _, f := range files {
		docs := yamlDocs(t, f)
		if len(docs) == 1 && docs[0]["tests"] != nil {
			continue // a promtool unit test
		}
		if !listed[filepath.Base(f)] {
			t.Errorf("rule file %s is not loaded by prometheus.yml", filepath.Base(f))
		}
		for _, doc := range docs {
			for _, g := range asList(doc["groups"]) {
				for _, r := range asList(asMap(g)["rules"]) {
					r := asMap(r)
					name := asString(r["alert"]) + asString(r["record"])
					if rec := asString(r["record"]); rec != "" {
						recorded[rec] = true
					}
					if asString(r["expr"]) == "" || name == "" {
						t.Errorf("%s: a rule without a name or an expression", filepath.Base(f))
					}
					rules = append(rules, rule{filepath.Base(f), name, asString(r["expr"])})
				}
			}
		}
	}
	alerts := map[string]bool{}
	for _, r := range rules {
		alerts[r.name] = true
		if err := balanced(r.expr); err != "" {
			t.Errorf("%s: %s: %s in %q", r.file, r.name, err, r.expr)
		}
		names := metricNames(r.expr)
		if len(names) == 0 {
			t.Errorf("%s: %s: no metric in %q", r.file, r.name, r.expr)
		}
		for _, n := range names {
			if !known(n) && !recorded[n] {
				t.Errorf("%s: rule %s names %s, which no binary exports", r.file, r.name, n)
			}
		}
	}
	for _, want := range []string{"RateLimiterSharedStoreUnavailable", "RateLimiterBreakerOpen", "MeterConsumerLag",
		"MeteringEmitterDrops", "WebhookDeliveryFailures"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}

	// The Grafana dashboard.
	raw, err := os.ReadFile(filepath.Join(repo.Root(t), "deploy", "grafana", "dashboards", "ratewarden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
		Templ  struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("ratewarden.json: %v", err)
	}
	var exprs []string
	var walk func(ps []json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, p := range ps {
			var panel struct {
				Title   string            `json:"title"`
				Panels  []json.RawMessage `json:"panels"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(p, &panel); err != nil {
				t.Fatalf("panel: %v", err)
			}
			for _, tg := range panel.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(panel.Panels)
		}
	}
	walk(dash.Panels)
	labelValues := regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	for _, v := range dash.Templ.List {
		q := ""
		switch x := v.Query.(type) {
		case string:
			q = x
		case map[string]any:
			q = asString(x["query"])
		}
		for _, m := range labelValues.FindAllStringSubmatch(q, -1) {
			exprs = append(exprs, m[1])
		}
	}
	if len(exprs) < 10 {
		t.Errorf("dashboard has only %d queries", len(exprs))
	}
	var unknown []string
	for _, e := range exprs {
		if err := balanced(e); err != "" {
			t.Errorf("dashboard: %s in %q", err, e)
		}
		for _, n := range metricNames(e) {
			if !known(n) && !recorded[n] {
				unknown = append(unknown, n)
			}
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		t.Errorf("the dashboard names metrics no binary exports: %v", unknown)
	}
}

// balanced reports unbalanced brackets outside strings ("" when balanced):
// the cheapest syntax check of an expression without a PromQL parser.
func balanced(expr string) string {
	s := quoted.ReplaceAllString(expr, `""`)
	var stack []rune
	pair := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range s {
		switch r {
		case '(', '[', '{':
			stack = append(stack, r)
		case ')', ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != pair[r] {
				return "unbalanced " + string(r)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 {
		return "unclosed " + string(stack[len(stack)-1])
	}
	return ""
}
