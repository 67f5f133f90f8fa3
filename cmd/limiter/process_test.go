package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// limiterBin is the limiter built once for the process tests.
var limiterBin string

func TestMain(m *testing.M) {
	if testenv.Short() {
		os.Exit(m.Run()) // no binary: the tests that run one skip
	}
	var err error
	if limiterBin, err = testenv.Build("cmd/limiter"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testenv.Main(m))
}

// limiterProc is a limiter process started for a test.
type limiterProc struct {
	url  string
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

// storeDecides is the environment of a test whose every decision, settle
// and charge must be made by the store: a store deadline no busy machine
// reaches. The default LIMITER_STORE_TIMEOUT, a few milliseconds, is a
// production figure that a starved test process misses now and then, and
// then a decision is degraded (it spends no shared tokens) and a settle is
// queued (202) instead of applied.
func storeDecides() string {
	return "LIMITER_STORE_TIMEOUT=" + testenv.Timeout(2*time.Second).String()
}

// startLimiter runs the limiter binary with env (on top of a free
// LIMITER_ADDR) and waits until it answers /healthz.
func startLimiter(t testing.TB, policyYAML string, env ...string) *limiterProc {
	t.Helper()
	return startLimiterBinary(t, limiterBin, policyYAML, env...)
}

// startLimiterBinary is startLimiter with another build of the binary.
func startLimiterBinary(t testing.TB, bin, policyYAML string, env ...string) *limiterProc {
	t.Helper()
	testenv.SkipShort(t)
	dir := t.TempDir()
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "LIMITER_ADDR="+addr, "POLICY_FILE="+policyPath)
	cmd.Env = append(cmd.Env, env...)
	scheme := "http"
	for _, kv := range env {
		if strings.HasPrefix(kv, "LIMITER_TLS_CERT_FILE=") {
			scheme = "https" // the test verifies the certificate itself (listentls_test.go)
		}
	}
	p := &limiterProc{url: scheme + "://" + addr, cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	testenv.FailOnRaceReport(t, "the limiter", p.logs.String) // after the stop below: cleanups run last first
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(testenv.Timeout(10 * time.Second)):
			cmd.Process.Kill()
			t.Errorf("limiter did not stop within 10 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("limiter logs:\n%s", p.logs.String())
		}
	})
	deadline := time.Now().Add(testenv.Timeout(20 * time.Second))
	for {
		resp, err := startClient.Get(p.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("limiter exited at start: %s", p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("limiter not healthy: %v\n%s", err, p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type decision struct {
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	Limit        int64  `json:"limit"`
	RetryAfterMs int64  `json:"retryAfterMs"`
	Source       string `json:"source"`
	Warning      bool   `json:"warning"`
	DryRun       bool   `json:"dryRun"`
	WouldAllow   bool   `json:"wouldAllow"`
	Policy       string `json:"policy"`
}

// startClient only waits for a limiter to answer, over HTTPS too (without
// verifying its certificate: that is what the TLS tests check, with their
// own clients).
var startClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
}}

var client = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64},
}

// check posts one /check and returns the decision and the HTTP status. A
// negative cost sends none (the policy's cost for the scope applies).
func (p *limiterProc) check(t testing.TB, key, scope string, cost int) (decision, int) {
	body := fmt.Sprintf(`{"key":%q,"scope":%q,"cost":%d}`, key, scope, cost)
	if cost < 0 {
		body = fmt.Sprintf(`{"key":%q,"scope":%q}`, key, scope)
	}
	resp, err := client.Post(p.url+"/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Errorf("POST /check: %v", err)
		return decision{}, 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var d decision
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &d); err != nil {
			t.Errorf("decode %q: %v", b, err)
		}
	}
	return d, resp.StatusCode
}

func (p *limiterProc) readyz(t testing.TB) map[string]any {
	resp, err := client.Get(p.url + "/readyz")
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	body["httpStatus"] = resp.StatusCode
	return body
}

// metric returns the sum of the samples of a metric whose line starts with
// prefix (name plus optional labels), from /metrics.
func (p *limiterProc) metric(t testing.TB, prefix string) float64 {
	resp, err := client.Get(p.url + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// syncBuffer collects a process's stderr while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
