package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// bins is the directory of limiter, meter-consumer and usage-api, built once.
var bins string

func TestMain(m *testing.M) {
	if testenv.Short() {
		os.Exit(m.Run()) // no binaries: the tests that run them skip
	}
	for _, cmd := range []string{"cmd/limiter", "cmd/meter-consumer", "cmd/usage-api"} {
		bin, err := testenv.Build(cmd)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		bins = filepath.Dir(bin)
	}
	os.Exit(testenv.Main(m))
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type proc struct {
	name string
	url  string
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
	err  error
}

// start runs one of the binaries with env and waits until path answers 200.
func start(t *testing.T, name, addrVar, ready string, env ...string) *proc {
	t.Helper()
	testenv.SkipShort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(filepath.Join(bins, name))
	cmd.Env = append(append(os.Environ(), addrVar+"="+addr), env...)
	p := &proc{name: name, url: "http://" + addr, cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, tail(p.logs.String(), 4000))
		}
	})
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		resp, err := http.Get(p.url + ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited at start: %s", name, p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready on %s: %v\n%s", name, ready, err, tail(p.logs.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and fails the test if the process does not exit 0
// within 10 s.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, p.err)
		}
	case <-time.After(testenv.Timeout(10 * time.Second)):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop within 10 s of SIGTERM", p.name)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func call(t *testing.T, method, u, token, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// e2ePolicy refills one token an hour: the 15 requests of a key are
// certain to exhaust its bucket (and 12 to cross the soft limit), however
// slowly the machine sends them.
const e2ePolicy = `version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 5, soft_limit_percent: 50 }
  pro:  { rate: 1, period: hour, burst: 8, quota: { limit: 1000, period: day } }
costs: { "api:search": 2 }
keys: { acct_pro: pro }
`

type counts struct{ Requests, Allowed, Rejected, Cost uint64 }

// TestUsageEqualsChecks: decisions sent through the limiter's POST /check
// travel Kafka → meter-consumer → ClickHouse, and GET /v1/usage of the
// usage-api binary reports exactly the counts the /check answers showed,
// for every window; then every binary stops cleanly on SIGTERM.
func TestUsageEqualsChecks(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 4)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"KAFKA_BROKERS=" + kafka.Addr(), "KAFKA_TOPIC=" + kafka.Topic(), "CLICKHOUSE_ADDR=" + ch.Addr(),
		"CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy}
	meter := start(t, "meter-consumer", "METER_ADDR", "/readyz", append(common, "METER_BATCH_WAIT=50ms")...)
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", common...)
	const admin = "e2e-admin-token-0123456789"
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(common, "USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef")...)

	want := map[[2]string]*counts{}
	for _, key := range []string{"acct_free", "acct_pro"} {
		for _, scope := range []string{"api:search", "api:read"} {
			c := &counts{}
			want[[2]string{key, scope}] = c
			for i := 0; i < 15; i++ {
				code, b := call(t, "POST", limiter.url+"/check", "", fmt.Sprintf(`{"key":%q,"scope":%q}`, key, scope))
				if code != 200 {
					t.Fatalf("check: %d %s", code, b)
				}
				var d struct{ Allowed bool }
				if err := json.Unmarshal(b, &d); err != nil {
					t.Fatal(err)
				}
				c.Requests++
				if d.Allowed {
					c.Allowed++
					if scope == "api:search" {
						c.Cost += 2
					} else {
						c.Cost++
					}
				} else {
					c.Rejected++
				}
			}
			if c.Allowed == 0 || c.Rejected == 0 {
				t.Fatalf("%s/%s: %+v; want both allowed and rejected decisions", key, scope, *c)
			}
		}
	}

	from := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	to := time.Now().UTC().Add(time.Hour).Format(time.RFC3339)
	read := func(key, window, token string) map[string]counts {
		q := url.Values{"window": {window}, "group_by": {"scope"}, "from": {from}, "to": {to}}
		if token == admin {
			q.Set("key", key)
		}
		code, b := call(t, "GET", api.url+"/v1/usage?"+q.Encode(), token, "")
		if code != 200 {
			t.Fatalf("usage: %d %s", code, b)
		}
		var u struct {
			Series []struct {
				Scope                             string
				Requests, Allowed, Rejected, Cost uint64
			}
		}
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatal(err)
		}
		out := map[string]counts{}
		for _, p := range u.Series {
			c := out[p.Scope]
			c.Requests += p.Requests
			c.Allowed += p.Allowed
			c.Rejected += p.Rejected
			c.Cost += p.Cost
			out[p.Scope] = c
		}
		return out
	}
	equal := func(key string, got map[string]counts) bool {
		for _, scope := range []string{"api:search", "api:read"} {
			if got[scope] != *want[[2]string{key, scope}] {
				return false
			}
		}
		return len(got) == 2
	}
	// Each rollup table (minute, hour, day) is written by its own INSERT, so
	// one can be ahead of another for a moment (seconds on a loaded
	// machine): wait until every window shows the counts, which never go
	// down, then compare what each reader sees.
	windows := []string{"minute", "hour", "day"}
	settled := func() bool {
		for _, w := range windows {
			if !equal("acct_free", read("acct_free", w, admin)) || !equal("acct_pro", read("acct_pro", w, admin)) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(testenv.Timeout(2 * time.Minute))
	for !settled() {
		if time.Now().After(deadline) {
			for _, w := range windows {
				t.Logf("window %s: free %+v pro %+v", w, read("acct_free", w, admin), read("acct_pro", w, admin))
			}
			for k, c := range want {
				t.Logf("want %s/%s %+v", k[0], k[1], *c)
			}
			t.Fatal("usage never reached the /check counts in every window")
		}
		time.Sleep(200 * time.Millisecond)
	}
	code, b := call(t, "POST", api.url+"/v1/admin/portal-tokens", admin, `{"key":"acct_pro","ttl_seconds":600}`)
	if code != 201 {
		t.Fatalf("token: %d %s", code, b)
	}
	var tok struct{ Token string }
	_ = json.Unmarshal(b, &tok)
	for _, w := range windows {
		if got := read("acct_pro", w, tok.Token); !equal("acct_pro", got) {
			t.Errorf("window %s through a portal token: %+v", w, got)
		}
		if got := read("acct_free", w, admin); !equal("acct_free", got) {
			t.Errorf("window %s for acct_free: %+v", w, got)
		}
	}
	code, b = call(t, "GET", api.url+"/v1/quota", tok.Token, "")
	var q struct{ Quota struct{ Used, Limit uint64 } }
	_ = json.Unmarshal(b, &q)
	if wantUsed := want[[2]string{"acct_pro", "api:search"}].Cost + want[[2]string{"acct_pro", "api:read"}].Cost; code != 200 || q.Quota.Used != wantUsed || q.Quota.Limit != 1000 {
		t.Errorf("quota: %d %s, want used %d", code, b, wantUsed)
	}
	for _, p := range []*proc{api, limiter, meter} {
		p.stop(t)
	}
}

// TestBadConfigExits: the binary refuses a bad environment at start with
// one line naming the variable and a non-zero exit.
func TestBadConfigExits(t *testing.T) {
	testenv.SkipShort(t) // runs the binary
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef"}, "USAGE_ADMIN_TOKEN"},
		{[]string{"USAGE_ADMIN_TOKEN=e2e-admin-token-0123456789"}, "USAGE_TOKEN_SECRET"},
		{[]string{"USAGE_ADMIN_TOKEN=e2e-admin-token-0123456789", "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef", "CLICKHOUSE_DATABASE=a-b"}, "CLICKHOUSE_DATABASE"},
	} {
		cmd := exec.Command(filepath.Join(bins, "usage-api"))
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE")}, tc.env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("%v: %v, want a non-zero exit", tc.env, err)
		}
		if out := strings.TrimSpace(stderr.String()); strings.Count(out, "\n") != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: stderr %q, want one line naming %s", tc.env, out, tc.want)
		}
	}
}

// TestStartsWithoutClickHouse: started while ClickHouse is down, the binary
// serves 503 with a reason, and becomes ready by itself once ClickHouse is
// up (schema applied in the background).
func TestStartsWithoutClickHouse(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	ch.Process().Kill() // a crash: ch.Start brings it back on the same port
	const admin = "e2e-admin-token-0123456789"
	api := start(t, "usage-api", "USAGE_API_ADDR", "/healthz", "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db,
		"USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef", "USAGE_QUERY_TIMEOUT=2s")
	if code, b := call(t, "GET", api.url+"/readyz", "", ""); code != 503 || !strings.Contains(string(b), `"reason"`) {
		t.Fatalf("readyz while ClickHouse is down: %d %s", code, b)
	}
	if code, b := call(t, "GET", api.url+"/v1/usage?key=k", admin, ""); code != 503 || !strings.Contains(string(b), "store_unavailable") {
		t.Fatalf("usage while ClickHouse is down: %d %s", code, b)
	}
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		code, b := call(t, "GET", api.url+"/readyz", "", "")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after ClickHouse came back: %d %s", code, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, b := call(t, "GET", api.url+"/v1/usage?key=k", admin, ""); code != 200 {
		t.Fatalf("usage after recovery: %d %s", code, b)
	}
}
