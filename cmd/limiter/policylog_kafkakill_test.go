package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkadev"
	"github.com/ratewarden/ratewarden/internal/testenv"
)

// TestPolicyLogKafkaKilledMidRun: a tailing limiter whose Kafka dies keeps
// the revision in force (decisions go on under it), says so in /readyz
// (policy.logError) and counts the failed reads; when Kafka is back — an
// in-memory broker comes back empty, a log that started over — it reads
// the new log from its start and enforces the new log's revision, although
// that revision's number is below the one it held.
func TestPolicyLogKafkaKilledMidRun(t *testing.T) {
	t.Parallel()
	testenv.SkipShort(t) // runs the binary
	port := testenv.FreePort(t)
	k, err := testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: "ratelimit.decisions", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			k.Close()
		}
	})
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	doc := writeTemp(t, "a.yaml", logDocA)
	for _, args := range [][]string{
		{"policy", "push", doc, "-m", "first", "--author", "alice"},
		{"override", "set", "acct_1", "--tier", "pro", "--reason", "deal", "--author", "billing"},
		{"override", "set", "acct_2", "--tier", "pro", "--reason", "deal", "--author", "billing"},
	} {
		if out, errOut, code := runCLI(t, env, args...); code != 0 {
			t.Fatalf("%v: %d %q %q", args, code, out, errOut)
		}
	}
	p := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "POLICY_CACHE_DIR="+t.TempDir(), "LIMITER_GRPC_ADDR=")...)
	waitRevision(t, p, 3)

	k.Close()
	closed = true
	waitFor(t, "policy.logError in /readyz", 60*time.Second, func() bool {
		pol := p.policyOf(t)
		return pol["logError"] != nil
	})
	pol := p.policyOf(t)
	if pol["revision"] != float64(3) || pol["source"] != "kafka" || !strings.Contains(pol["logError"].(string), "revision in force stays") {
		t.Fatalf("with Kafka down: %v, want revision 3 from the log kept, and why it cannot be read", pol)
	}
	if d, _ := p.check(t, "acct_1", "x", 1); d.Policy != "override:acct_1" {
		t.Fatalf("with Kafka down acct_1 is decided by %q, want its override of revision 2", d.Policy)
	}
	if n := p.metric(t, "limiter_policy_log_errors_total"); n < 1 {
		t.Fatalf("limiter_policy_log_errors_total = %v with Kafka down", n)
	}

	// Back on the same address, empty: the new log's revision 1.
	k2, err := testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: "ratelimit.decisions", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Close)
	if out, errOut, code := runCLI(t, env, "policy", "push", doc, "-m", "after the restart", "--author", "ops"); code != 0 || !strings.Contains(out, "applied: revision 1") {
		t.Fatalf("push to the new log: %d %q %q", code, out, errOut)
	}
	waitFor(t, "revision 1 of the new log", 60*time.Second, func() bool {
		pol := p.policyOf(t)
		return pol["revision"] == float64(1) && pol["source"] == "kafka" && pol["logError"] == nil && pol["author"] == "ops"
	})
	if d, _ := p.check(t, "acct_1", "x", 1); d.Policy == "override:acct_1" {
		t.Fatalf("the new log has no override of acct_1, yet it decides: %+v", d)
	}
}
