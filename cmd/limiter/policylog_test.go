package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const logDocA = `version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
  pro:  { rate: 100, burst: 200 }
`

const logBootstrap = `version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 3 }
`

// runCLI runs the limiter binary as a CLI with env and returns stdout,
// stderr and the exit code.
func runCLI(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(limiterBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// policyOf is /readyz's policy object.
func (p *limiterProc) policyOf(t testing.TB) map[string]any {
	pol, _ := p.readyz(t)["policy"].(map[string]any)
	return pol
}

// waitRevision polls until the limiter reports revision rev from the log,
// within a generous deadline.
func waitRevision(t *testing.T, p *limiterProc, rev int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(30 * time.Second))
	for {
		pol := p.policyOf(t)
		if pol["revision"] == float64(rev) && pol["source"] == "kafka" {
			return pol
		}
		if time.Now().After(deadline) {
			t.Fatalf("limiter %s never reached revision %d: %v", p.url, rev, pol)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPolicyLogFleet: three limiters tail the log; every write, applied or
// refused, ends the same on all of them.
func TestPolicyLogFleet(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--author", "alice")
	if code != 0 || !strings.Contains(out, "applied: revision 1") {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	var fleet []*limiterProc
	for i := range 3 {
		fleet = append(fleet, startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka",
			"POLICY_CACHE_DIR="+t.TempDir(), fmt.Sprintf("LIMITER_INSTANCE_ID=l%d", i), "LIMITER_GRPC_ADDR=")...))
	}
	for _, p := range fleet {
		// Ready means the log was read to its end: revision 1 at once.
		if pol := p.policyOf(t); pol["revision"] != float64(1) || pol["source"] != "kafka" {
			t.Fatalf("at start: %v", pol)
		}
	}

	out, errOut, code = runCLI(t, env, "override", "set", "acct_1", "--tier", "pro", "--reason", "upgraded, ticket 7", "--author", "bob")
	if code != 0 || !strings.Contains(out, "applied: revision 2") {
		t.Fatalf("override set: %d %q %q", code, out, errOut)
	}
	for _, p := range fleet {
		waitRevision(t, p, 2)
		if d, _ := p.check(t, "acct_1", "x", 1); d.Policy != "override:acct_1" || d.Limit != 200 {
			t.Errorf("%s: acct_1 decided by %q limit %d, want the override's pro limit", p.url, d.Policy, d.Limit)
		}
	}

	// Two writers race with the same --expect-revision: exactly one wins.
	var wg sync.WaitGroup
	codes := make([]int, 2)
	outs := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			doc := logDocA + fmt.Sprintf("# writer %d\n", i)
			o, e, c := runCLI(t, env, "policy", "push", writeTemp(t, "r.yaml", doc), "-m", fmt.Sprintf("race %d", i),
				"--author", fmt.Sprintf("writer%d", i), "--expect-revision", "2")
			codes[i], outs[i] = c, o+e
		}()
	}
	wg.Wait()
	if codes[0]+codes[1] != 1 || codes[0]*codes[1] != 0 {
		t.Fatalf("racing pushes: exit codes %v (%q)", codes, outs)
	}
	loser := 0
	if codes[1] == 1 {
		loser = 1
	}
	if !strings.Contains(outs[loser], "refused (conflict)") || !strings.Contains(outs[loser], "writer") {
		t.Errorf("the loser's output: %q", outs[loser])
	}
	var hash any
	for i, p := range fleet {
		pol := waitRevision(t, p, 3)
		if i > 0 && pol["hash"] != hash {
			t.Errorf("%s: hash %v, another limiter has %v", p.url, pol["hash"], hash)
		}
		hash = pol["hash"]
	}

	// Refused: an invalid document, an override of an undefined tier.
	_, errOut, code = runCLI(t, env, "policy", "push", writeTemp(t, "bad.yaml", "version: 1\ntiers:\n  free: { rate: -1, burst: 0 }\n"), "-m", "bad")
	if code != 1 || !strings.Contains(errOut, "refused (invalid)") || !strings.Contains(errOut, "burst") || !strings.Contains(errOut, "rate") {
		t.Errorf("invalid document: %d %q", code, errOut)
	}
	_, errOut, code = runCLI(t, env, "override", "set", "acct_2", "--tier", "gold", "--reason", "r")
	if code != 1 || !strings.Contains(errOut, `"gold" is not defined`) {
		t.Errorf("undefined tier: %d %q", code, errOut)
	}
	// A garbled record written straight onto the topic: refused and
	// counted by every limiter, nothing else disturbed.
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Append(ctx, "policy", []byte(`{"revision":4,"parent":3,"kind":"policy","document":"garbage`)); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, env, "override", "set", "acct_3", "--rate", "5", "--burst", "9", "--reason", "after the garbage", "--json")
	if code != 0 || !strings.Contains(out, `"revision":4`) {
		t.Fatalf("override after garbage: %d %q %q", code, out, errOut)
	}
	for _, p := range fleet {
		waitRevision(t, p, 4)
		if n := p.metric(t, `limiter_policy_log_records_total{code="garbled",result="refused"}`); n != 1 {
			t.Errorf("%s: %v garbled records counted, want 1", p.url, n)
		}
		if n := p.metric(t, "limiter_policy_revision"); n != 4 {
			t.Errorf("%s: limiter_policy_revision %v", p.url, n)
		}
		if d, code := p.check(t, "acct_3", "x", 1); code != 200 || d.Limit != 9 {
			t.Errorf("%s: acct_3: %d %+v", p.url, code, d)
		}
	}
	out, _, code = runCLI(t, env, "policy", "history", "--limit", "10")
	if code != 0 || !strings.Contains(out, "head: revision 4") || !strings.Contains(out, "garbled") || !strings.Contains(out, "log key policy") {
		t.Errorf("history: %d\n%s", code, out)
	}
	urls := fleet[0].url + "," + fleet[1].url + "," + fleet[2].url
	out, errOut, code = runCLI(t, env, "fleet", "status", "--limiters", urls)
	if code != 0 || strings.Count(out, "current") != 3 {
		t.Errorf("fleet status: %d %q %q", code, out, errOut)
	}
}

// TestPolicyLogKafkaDownAtStart: a limiter that cannot reach the log
// starts from the last revision it applied, else from POLICY_FILE, and
// says which; it never refuses to start.
func TestPolicyLogKafkaDownAtStart(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first"); code != 0 {
		t.Fatalf("push: %q %q", out, errOut)
	}
	if out, errOut, code := runCLI(t, env, "override", "set", "acct_c", "--tier", "pro", "--expires", "24h", "--reason", "cached too"); code != 0 {
		t.Fatalf("override: %q %q", out, errOut)
	}
	cache := t.TempDir()
	first := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "POLICY_CACHE_DIR="+cache, "LIMITER_GRPC_ADDR=")...)
	waitRevision(t, first, 2)
	if _, err := os.Stat(filepath.Join(cache, cacheFile)); err != nil {
		t.Fatalf("no cache written: %v", err)
	}
	addr := k.Addr()
	k.Close()

	down := []string{"KAFKA_BROKERS=" + addr, "POLICY_SOURCE=kafka", "POLICY_START_WAIT=1s", "LIMITER_GRPC_ADDR="}
	fromCache := startLimiter(t, logBootstrap, append(down, "POLICY_CACHE_DIR="+cache)...)
	if pol := fromCache.policyOf(t); pol["source"] != "cache" || pol["revision"] != float64(2) || pol["overrides"] != float64(1) {
		t.Errorf("with a cache: %v", pol)
	}
	if n := fromCache.metric(t, `limiter_policy_source{source="cache"}`); n != 1 {
		t.Errorf("limiter_policy_source{source=cache} = %v", n)
	}
	if d, _ := fromCache.check(t, "k", "x", 1); d.Limit != 20 {
		t.Errorf("from the cache, the free tier's burst is %d, want 20", d.Limit)
	}
	if d, _ := fromCache.check(t, "acct_c", "x", 1); d.Limit != 200 || d.Policy != "override:acct_c" {
		t.Errorf("from the cache, the override: %+v", d)
	}
	fromFile := startLimiter(t, logBootstrap, append(down, "POLICY_CACHE_DIR="+t.TempDir())...)
	if pol := fromFile.policyOf(t); pol["source"] != "bootstrap" || pol["revision"] != float64(0) {
		t.Errorf("without a cache: %v", pol)
	}
	if d, _ := fromFile.check(t, "k", "x", 1); d.Limit != 3 {
		t.Errorf("from the bootstrap file, the burst is %d, want 3", d.Limit)
	}
}

// TestPolicyLogPushUnderLoad: revisions swap in between decisions; none
// of a bounded stream of decisions fails while ten pushes land.
func TestPolicyLogPushUnderLoad(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first"); code != 0 {
		t.Fatalf("push: %q %q", out, errOut)
	}
	p := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")...)
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := policylog.NewClient(l, true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := map[int]int{}
	total := 0
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ { // bounded; ends early once the pushes are done
				select {
				case <-stop:
					return
				default:
				}
				_, code := p.check(t, fmt.Sprintf("k%d-%d", g, i%50), "x", 1)
				mu.Lock()
				total++
				if code != 200 {
					bad[code]++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range 10 {
		doc := logDocA
		if i%2 == 0 {
			doc = strings.Replace(logDocA, "rate: 10, burst: 20", "rate: 12, burst: 24", 1)
		}
		if _, err := w.Push(ctx, doc+fmt.Sprintf("# %d\n", i), "load", "push under load", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	waitRevision(t, p, 11)
	close(stop)
	wg.Wait()
	if len(bad) > 0 || total == 0 {
		t.Fatalf("%d decisions, failed by status: %v", total, bad)
	}
	if d, _ := p.check(t, "fresh", "x", 1); d.Limit != 20 {
		t.Errorf("after the last push (revision 11), burst %d, want 20", d.Limit)
	}
}

// TestPolicyLogCLIVerbs: show, diff, rollback, override get/list/delete,
// and strict flags.
func TestPolicyLogCLIVerbs(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	docB := strings.Replace(logDocA, "rate: 10, burst: 20", "rate: 12, burst: 24", 1)
	for i, doc := range []string{logDocA, docB} {
		if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "p.yaml", doc), "-m", fmt.Sprintf("doc %d", i)); code != 0 {
			t.Fatalf("push %d: %q %q", i, out, errOut)
		}
	}
	out, _, code := runCLI(t, env, "policy", "show", "1")
	if code != 0 || !strings.Contains(out, "rate: 10, burst: 20") || !strings.Contains(out, "# revision 1") {
		t.Errorf("show 1: %d %q", code, out)
	}
	out, _, code = runCLI(t, env, "policy", "diff", "1", "2")
	if code != 0 || !strings.Contains(out, "-  free: { rate: 10, burst: 20 }") || !strings.Contains(out, "+  free: { rate: 12, burst: 24 }") {
		t.Errorf("diff: %d %q", code, out)
	}
	out, errOut, code := runCLI(t, env, "policy", "rollback", "1", "-m", "back to 1")
	if code != 0 || !strings.Contains(out, "applied: revision 3") {
		t.Fatalf("rollback: %d %q %q", code, out, errOut)
	}
	if out, _, _ = runCLI(t, env, "policy", "show"); !strings.Contains(out, "rate: 10, burst: 20") || !strings.Contains(out, "# revision 3") {
		t.Errorf("show after rollback: %q", out)
	}
	if out, errOut, code = runCLI(t, env, "override", "set", "acct_9", "--scope", "api:search", "--rate", "60", "--period", "minute", "--burst", "5", "--expires", "2h", "--reason", "launch"); code != 0 {
		t.Fatalf("override set: %q %q", out, errOut)
	}
	out, _, code = runCLI(t, env, "override", "get", "acct_9", "--scope", "api:search", "--json")
	if code != 0 || !strings.Contains(out, `"rate":60`) || !strings.Contains(out, `"expires"`) {
		t.Errorf("override get: %d %q", code, out)
	}
	if out, _, code = runCLI(t, env, "override", "list"); code != 0 || !strings.Contains(out, "acct_9\tapi:search\trate 60/minute burst 5") {
		t.Errorf("override list: %d %q", code, out)
	}
	if out, errOut, code = runCLI(t, env, "override", "delete", "acct_9", "--scope", "api:search", "--reason", "over"); code != 0 || !strings.Contains(out, "revision 5") {
		t.Errorf("override delete: %d %q %q", code, out, errOut)
	}
	if _, _, code = runCLI(t, env, "override", "get", "acct_9", "--scope", "api:search"); code != 1 {
		t.Errorf("get a deleted override: exit %d, want 1", code)
	}
	for _, args := range [][]string{
		{"policy", "push", "f.yaml", "-m", "x", "--bogus"},
		{"policy", "push", "f.yaml"},              // no -m
		{"override", "set", "k", "--tier", "pro"}, // no --reason
		{"policy", "history", "extra"},
		{"fleet", "status"}, // no limiters
	} {
		if _, errOut, code := runCLI(t, append(env, "LIMITER_FLEET_URLS="), args...); code != 2 || !strings.Contains(errOut, "usage") {
			t.Errorf("%v: exit %d, want 2 with the usage (%q)", args, code, errOut)
		}
	}
}
