package deploytest

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/repo"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPrometheusRules runs promtool (Debian package prometheus) on
// deploy/prometheus/rules: `promtool check rules` on every rule file and
// `promtool test rules` on every unit test (*_test.yml), and requires that
// every alert is expected to fire in some unit test, so that an alert that
// cannot fire is a test failure. A missing promtool is a failure, not a
// skip: the rules would go unchecked.
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	testenv.SkipShort(t) // runs promtool
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is needed to check the Prometheus rules (apt-get install prometheus): %v", err)
	}
	dir := filepath.Join(repo.Root(t), "deploy", "prometheus", "rules")
	files, err := filepath.Glob(filepath.Join(dir, "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule files in %s: %v", dir, err)
	}
	var ruleFiles, testFiles []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.yml") {
			testFiles = append(testFiles, f)
		} else {
			ruleFiles = append(ruleFiles, f)
		}
	}
	if len(testFiles) == 0 {
		t.Fatalf("no promtool unit tests (*_test.yml) in %s", dir)
	}
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = dir // unit tests name their rule files relative to themselves
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(append([]string{"check", "rules"}, ruleFiles...)...)
	run(append([]string{"test", "rules"}, testFiles...)...)

	// Every alert fires in at least one unit test (an alert_rule_test with
	// expected alerts).
	var alerts []string
	for _, f := range ruleFiles {
		for _, doc := range yamlDocs(t, f) {
			for _, g := range asList(doc["groups"]) {
				for _, r := range asList(asMap(g)["rules"]) {
					if a := asString(asMap(r)["alert"]); a != "" {
						alerts = append(alerts, filepath.Base(f)+": "+a)
					}
				}
			}
		}
	}
	fires := map[string]bool{}
	for _, f := range testFiles {
		for _, doc := range yamlDocs(t, f) {
			for _, tc := range asList(doc["tests"]) {
				for _, at := range asList(asMap(tc)["alert_rule_test"]) {
					if len(asList(asMap(at)["exp_alerts"])) > 0 {
						fires[asString(asMap(at)["alertname"])] = true
					}
				}
			}
		}
	}
	for _, a := range alerts {
		if name := a[strings.Index(a, ": ")+2:]; !fires[name] {
			t.Errorf("%s: no promtool unit test in rules/*_test.yml shows this alert firing", a)
		}
	}
	if !slices.Contains(alerts, "alerts.yml: MeterPartitionStalled") {
		t.Errorf("alerts.yml has no MeterPartitionStalled (the meter-consumer stall watchdog's alert)")
	}
}
