package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyLogKafkaKilledMidRun: tailing limiters whose Kafka dies keep
// the revision in force (decisions go on under it), say so in /readyz
// (policy.logError) and count the failed reads. When Kafka is back empty
// (an in-memory broker, a cluster rebuilt: the log is lost) and someone
// pushes revision 1 on the empty log, none of them applies it: each keeps
// revision 3 and its overrides, /readyz policy.status is "stale" with the
// reason, and limiter_policy_log_stale is 1. `limiter policy restore
// --from-cache` writes the state back as epoch 1: every limiter applies
// it, with the digest it had before, and later writes go on from it.
// Five limiters, the fleet of the issue that found the split: every one
// agrees at every step, and none loses an override.
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
	var fleet []*limiterProc
	var caches []string
	for i := range 5 {
		caches = append(caches, t.TempDir())
		fleet = append(fleet, startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "POLICY_CACHE_DIR="+caches[i],
			fmt.Sprintf("LIMITER_INSTANCE_ID=l%d", i), "LIMITER_GRPC_ADDR=")...))
	}
	digest := ""
	for _, p := range fleet {
		pol := waitRevision(t, p, 3)
		if pol["digest"] == nil || (digest != "" && pol["digest"] != digest) {
			t.Fatalf("at revision 3: %v, want one digest on every limiter (%s)", pol, digest)
		}
		digest = pol["digest"].(string)
	}

	k.Close()
	closed = true
	p := fleet[0]
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

	// Back on the same address, empty; a careless push writes revision 1
	// of a new history.
	k2, err := testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: "ratelimit.decisions", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Close)
	if out, errOut, code := runCLI(t, env, "policy", "push", doc, "-m", "after the restart", "--author", "ops"); code != 0 || !strings.Contains(out, "applied: revision 1") {
		t.Fatalf("push to the new log: %d %q %q", code, out, errOut)
	}
	for _, p := range fleet {
		waitFor(t, "the stale status", 60*time.Second, func() bool { return p.policyOf(t)["status"] == "stale" })
		pol := p.policyOf(t)
		if pol["revision"] != float64(3) || pol["overrides"] != float64(2) || pol["digest"] != digest || !strings.Contains(pol["logError"].(string), "limiter policy restore") {
			t.Fatalf("%s after the lost log and a push: %v, want revision 3, its 2 overrides and digest %s kept, and why", p.url, pol, digest)
		}
		for _, key := range []string{"acct_1", "acct_2"} {
			if d, _ := p.check(t, key, "x", 1); d.Policy != "override:"+key {
				t.Fatalf("%s: %s is decided by %q after the lost log, want its override", p.url, key, d.Policy)
			}
		}
		if n := p.metric(t, "limiter_policy_log_stale"); n != 1 {
			t.Fatalf("%s: limiter_policy_log_stale = %v", p.url, n)
		}
	}

	// The restore, from one limiter's cache.
	out, errOut, code := runCLI(t, env, "policy", "restore", "--from-cache", caches[1], "-m", "the broker lost its log", "--author", "ops")
	if code != 0 || !strings.Contains(out, "epoch 1: revision 3 restored with 2 overrides, digest "+digest) {
		t.Fatalf("restore: %d %q %q", code, out, errOut)
	}
	for _, p := range fleet {
		waitFor(t, "the restore applied", 60*time.Second, func() bool {
			pol := p.policyOf(t)
			return pol["status"] == "ok" && pol["epoch"] == float64(1)
		})
		if pol := p.policyOf(t); pol["revision"] != float64(3) || pol["digest"] != digest || pol["overrides"] != float64(2) {
			t.Fatalf("%s after the restore: %v, want revision 3 and digest %s", p.url, pol, digest)
		}
		for _, key := range []string{"acct_1", "acct_2"} {
			if d, _ := p.check(t, key, "x", 1); d.Policy != "override:"+key {
				t.Fatalf("%s: %s is decided by %q after the restore, want its override", p.url, key, d.Policy)
			}
		}
	}
	if out, errOut, code := runCLI(t, env, "override", "set", "acct_3", "--tier", "pro", "--reason", "new", "--author", "billing"); code != 0 || !strings.Contains(out, "applied: revision 4") {
		t.Fatalf("a write after the restore: %d %q %q", code, out, errOut)
	}
	for _, p := range fleet {
		waitRevision(t, p, 4)
	}
}
