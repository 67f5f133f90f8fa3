package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/repo"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// upComponents are the processes `make up` starts (scripts/lib.sh).
var upComponents = []string{"redis", "clickhouse", "kafka-dev", "limiter", "meter-consumer", "usage-api", "demo-traffic"}

// TestUpDown (not parallel: its free ports must not race with the other
// test's servers) runs `make up` as a newcomer would (on free ports and in a
// temporary run directory, so that it never meets a stack that is already
// up), sends /check traffic, waits for the usage API to report it, runs
// `make up` again (nothing new starts), then `make down`, and checks that
// no process it started is left.
func TestUpDown(t *testing.T) {
	t.Parallel()
	root := repo.Root(t)
	buildBinaries(t) // warms the build cache that `make up` uses
	runDir, binDir := t.TempDir(), t.TempDir()
	// Free ports, chosen again if another test took one before make up ran.
	var ports map[string]int
	var env []string
	pickPorts := func() {
		ports = map[string]int{}
		used := map[int]bool{}
		for _, v := range []string{"RW_REDIS_PORT", "RW_CLICKHOUSE_PORT", "RW_CLICKHOUSE_HTTP_PORT", "RW_KAFKA_PORT",
			"RW_LIMITER_PORT", "RW_USAGE_PORT", "RW_METER_PORT"} {
			p := testenv.FreePort(t)
			for used[p] {
				p = testenv.FreePort(t)
			}
			used[p], ports[v] = true, p
		}
		// The environment of the test, without what an outer make (make
		// test) passes down to its children: this is a top-level `make up`.
		env = nil
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MAKELEVEL" && k != "MFLAGS" && !strings.HasPrefix(k, "RW_") {
				env = append(env, kv)
			}
		}
		env = append(env, "RUN_DIR="+runDir, "BIN_DIR="+binDir)
		for k, v := range ports {
			env = append(env, fmt.Sprintf("%s=%d", k, v))
		}
	}
	pickPorts()
	runMake := func(target string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", target)
		cmd.Dir, cmd.Env = root, env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("make %s (%s):\n%s", target, time.Since(start).Round(time.Millisecond), out)
		return string(out), err
	}
	failMake := func(target string, err error) {
		t.Helper()
		logs, _ := filepath.Glob(filepath.Join(runDir, "logs", "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("--- %s ---\n%s", filepath.Base(l), tailBytes(b, 3000))
		}
		t.Fatalf("make %s: %v", target, err)
	}
	makeRun := func(target string) string {
		t.Helper()
		out, err := runMake(target)
		if err != nil {
			failMake(target, err)
		}
		return out
	}
	var pids map[string]int
	t.Cleanup(func() {
		// Whatever happened, nothing may stay behind.
		cmd := exec.Command("make", "--no-print-directory", "down")
		cmd.Dir, cmd.Env = root, env
		_ = cmd.Run()
		for name, pid := range pids {
			if running(pid) {
				t.Errorf("%s (pid %d) still runs after make down; killing it", name, pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	var out string
	for attempt := 1; ; attempt++ {
		o, err := runMake("up")
		if err == nil || attempt == 3 || !strings.Contains(o, "port busy, nothing was started") {
			if err != nil {
				failMake("up", err)
			}
			out = o
			break
		}
		pickPorts() // a port was taken between choosing and starting
	}
	pids = readPids(t, runDir)
	for _, c := range upComponents {
		if pids[c] == 0 {
			t.Errorf("make up did not record a pid for %s", c)
		}
	}
	limiter := fmt.Sprintf("http://127.0.0.1:%d", ports["RW_LIMITER_PORT"])
	usageURL := fmt.Sprintf("http://127.0.0.1:%d", ports["RW_USAGE_PORT"])
	for _, want := range []string{limiter, usageURL, "Portal token", "curl -s -X POST " + limiter + "/check"} {
		if !strings.Contains(out, want) {
			t.Errorf("make up output does not show %q", want)
		}
	}

	checkPolicyLog(t, limiter, out)
	// An override set by a person: revision 2, kept across make down and
	// make up (the broker keeps its data under run/kafka).
	cliEnv := append(env, fmt.Sprintf("KAFKA_BROKERS=127.0.0.1:%d", ports["RW_KAFKA_PORT"]),
		fmt.Sprintf("CLICKHOUSE_ADDR=127.0.0.1:%d", ports["RW_CLICKHOUSE_PORT"]),
		// The stack runs signed: a person writes with the operator key
		// make up made, so the author is operator/updown.
		"POLICY_SIGNING_KEY_FILE="+filepath.Join(runDir, "keys", "operator.pem"),
		"POLICY_TRUSTED_KEYS_FILE="+filepath.Join(runDir, "keys", "keyring"))
	limiterCLI := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "limiter"), args...)
		cmd.Env = cliEnv
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("limiter %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	limiterCLI("override", "set", "acct_kept", "--tier", "pro", "--reason", "kept across make down", "--author", "updown")
	waitPolicy(t, limiter, 2, 1)

	// Idempotent: a second run starts nothing.
	out2 := makeRun("up")
	if again := readPids(t, runDir); fmt.Sprint(again) != fmt.Sprint(pids) {
		t.Errorf("second make up changed the processes: %v, then %v", pids, again)
	}
	if n := strings.Count(out2, "already running"); n != len(upComponents) {
		t.Errorf("second make up: %d components already running, want %d", n, len(upComponents))
	}

	// Traffic through /check shows up in the usage API.
	admin := readSecret(t, filepath.Join(runDir, "secrets.env"), "USAGE_ADMIN_TOKEN")
	before := checkTraffic(t, limiter, usageURL, admin)
	// The printed portal token reads the demo key, whose demo traffic is there.
	portal, err := os.ReadFile(filepath.Join(runDir, "portal-token"))
	if err != nil {
		t.Fatal(err)
	}
	if st, _, b := do(t, "GET", usageURL+"/v1/usage?window=minute", strings.TrimSpace(string(portal)), nil); st != 200 || !strings.Contains(string(b), `"key":"acct_demo_pro"`) {
		t.Errorf("portal token of make up: %d %s", st, b)
	}

	makeRun("down")
	for name, pid := range pids {
		if running(pid) {
			t.Errorf("%s (pid %d) still runs after make down", name, pid)
		}
	}
	for v, p := range ports {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 200*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("port %d (%s) still accepts connections after make down", p, v)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(runDir, "pids", "*.pid")); len(left) > 0 {
		t.Errorf("pid files left after make down: %v", left)
	}
	if out := makeRun("down"); !strings.Contains(out, "nothing was running") {
		t.Errorf("a second make down should find nothing running")
	}

	// Up again after down: the broker has its topics back (run/kafka), so
	// the policy log goes on at revision 2 with the override, its history
	// is the same, and the audit has one log (epoch 0), not a second one
	// numbered from 1 again.
	out = makeRun("up")
	pids = readPids(t, runDir)
	checkPolicyLog(t, limiter, out)
	waitPolicy(t, limiter, 2, 1)
	if h := limiterCLI("override", "get", "acct_kept"); !strings.Contains(h, "pro") || !strings.Contains(h, "updown") {
		t.Errorf("override get acct_kept after make down; make up: %s", h)
	}
	if h := limiterCLI("policy", "history"); !regexp.MustCompile(`(?m)^\s*2\s+applied\s+override acct_kept\s+operator/updown\b`).MatchString(h) {
		t.Errorf("policy history after make down; make up lacks revision 2 (override acct_kept by operator/updown):\n%s", h)
	}
	chHTTP := fmt.Sprintf("http://127.0.0.1:%d/?query=", ports["RW_CLICKHOUSE_HTTP_PORT"])
	auditQ := url.QueryEscape("SELECT log_epoch, revision, author FROM ratelimit.policy_audit FINAL WHERE result = 'applied' ORDER BY kafka_offset FORMAT TSV")
	for deadline := time.Now().Add(testenv.Timeout(60 * time.Second)); ; {
		st, _, b := do(t, "GET", chHTTP+auditQ, "", nil)
		if st == 200 && string(b) == "0\t1\toperator/make-up\n0\t2\toperator/updown\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("policy_audit after make down; make up: want revisions 1 (operator/make-up) and 2 (operator/updown) of epoch 0 only, got %d %q", st, b)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(runDir, "clickhouse.prev")); !os.IsNotExist(err) {
		t.Errorf("make up after make down moved the ClickHouse data aside (run/clickhouse.prev: %v)", err)
	}
	if got := usageOf(t, usageURL, admin, before.key); got != before.totals {
		t.Errorf("usage of %s after make down; make up: %+v, want the history kept: %+v", before.key, got, before.totals)
	}
	checkTraffic(t, limiter, usageURL, admin)
	if got := usageOf(t, usageURL, admin, before.key); got != before.totals {
		t.Errorf("usage of %s after new traffic: %+v, want %+v", before.key, got, before.totals)
	}
	makeRun("down")
	for name, pid := range pids {
		if running(pid) {
			t.Errorf("%s (pid %d) still runs after the second make down", name, pid)
		}
	}
}

// waitPolicy waits (a generous bound, not a measure) until the limiter's
// /readyz shows revision rev from the log with n overrides.
func waitPolicy(t *testing.T, limiter string, rev int64, n int) {
	t.Helper()
	var last []byte
	for deadline := time.Now().Add(testenv.Timeout(30 * time.Second)); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, _, b := do(t, "GET", limiter+"/readyz", "", nil)
		last = b
		var r struct {
			Policy struct {
				Revision  int64  `json:"revision"`
				Source    string `json:"source"`
				Overrides int    `json:"overrides"`
			} `json:"policy"`
		}
		if st == 200 && json.Unmarshal(b, &r) == nil && r.Policy.Source == "kafka" && r.Policy.Revision == rev && r.Policy.Overrides == n {
			return
		}
	}
	t.Errorf("limiter /readyz: want revision %d from the log with %d overrides, got %s", rev, n, last)
}

// checkPolicyLog: make up ran the limiter in log mode (/readyz: source
// kafka, a revision) and printed the log's history with revision 1, the
// push of deploy/policy.yaml.
func checkPolicyLog(t *testing.T, limiter, makeOut string) {
	t.Helper()
	st, _, b := do(t, "GET", limiter+"/readyz", "", nil)
	var r struct {
		Policy struct {
			Revision int64  `json:"revision"`
			Source   string `json:"source"`
		} `json:"policy"`
	}
	if st != 200 || json.Unmarshal(b, &r) != nil || r.Policy.Source != "kafka" || r.Policy.Revision < 1 {
		t.Errorf("limiter /readyz after make up: want policy source kafka and a revision: %d %s", st, b)
	}
	if !regexp.MustCompile(`(?m)^\s*1\s+applied\s+policy\b.*make-up`).MatchString(makeOut) {
		t.Errorf("make up did not print the policy log's history with revision 1 (deploy/policy.yaml, by make-up)")
	}
}

type usageTotals struct{ Requests, Allowed, Rejected int }

// recorded is a key's usage as the usage API reported it.
type recorded struct {
	key    string
	totals usageTotals
}

// usageOf returns the usage API's totals of key (zero when it fails).
func usageOf(t *testing.T, usageURL, admin, key string) usageTotals {
	t.Helper()
	q := url.Values{"key": {key}, "window": {"minute"}}
	st, _, b := do(t, "GET", usageURL+"/v1/usage?"+q.Encode(), admin, nil)
	var u struct {
		Totals usageTotals `json:"totals"`
	}
	if st != 200 || json.Unmarshal(b, &u) != nil {
		t.Errorf("usage of %s: %d %s", key, st, b)
	}
	return u.Totals
}

// sumSeries sums the values of the Prometheus text lines that start with
// prefix and contain label.
func sumSeries(text, prefix, label string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, prefix) || !strings.Contains(l, label) {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkTraffic sends 25 decisions of a new key, waits for the usage API
// to report all of them and returns what it reported.
func checkTraffic(t *testing.T, limiter, usageURL, admin string) recorded {
	t.Helper()
	key := "uptest_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const n = 25
	for i := 0; i < n; i++ {
		st, _, b := do(t, "POST", limiter+"/check", "", []byte(fmt.Sprintf(`{"key":%q,"scope":"api:orders"}`, key)))
		if st != 200 {
			t.Fatalf("POST /check: %d %s", st, b)
		}
	}
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		q := url.Values{"key": {key}, "window": {"minute"}}
		st, _, b := do(t, "GET", usageURL+"/v1/usage?"+q.Encode(), admin, nil)
		var u struct {
			Totals usageTotals `json:"totals"`
		}
		if st == 200 && json.Unmarshal(b, &u) == nil && u.Totals.Requests == n {
			// Free tier: burst 20, 10/s; how many refill during the loop depends on its speed.
			if u.Totals.Allowed < 20 || u.Totals.Allowed+u.Totals.Rejected != n {
				t.Errorf("usage of %s: %+v, want at least 20 allowed (free tier, burst 20), the rest rejected", key, u.Totals)
			}
			return recorded{key, u.Totals}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the usage API did not report %d requests of %s within 60s: %d %s", n, key, st, b)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func readPids(t *testing.T, runDir string) map[string]int {
	t.Helper()
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(runDir, "pids", "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(b))
		if len(fields) != 2 {
			t.Fatalf("%s: %q, want \"<pid> <executable>\"", f, b)
		}
		pid, err := strconv.Atoi(fields[0])
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
	}
	return out
}

// running reports whether pid is a live process (a zombie has ended).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func readSecret(t *testing.T, path, name string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+"="); ok {
			return v
		}
	}
	t.Fatalf("%s has no %s", path, name)
	return ""
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
