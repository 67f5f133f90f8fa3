package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyLogUnsafeTopic: a policy topic created by someone else with
// cleanup.policy=compact,delete (a plain admin client, not a writer of
// the log) can delete records. A limiter started on it says so: /readyz
// policy.status is "unsafe" and policy.logUnsafe names the configuration,
// /readyz stays 200 with no logError (the log is read), and
// limiter_policy_log_unsafe is 1. It keeps enforcing what it read, and
// goes on applying new revisions, each once, still unsafe.
func TestPolicyLogUnsafeTopic(t *testing.T) {
	t.Parallel()
	testenv.SkipShort(t) // runs the binary
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(k.Addr()), Timeout: 10 * time.Second}
	res, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: "ratelimit.policy", NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact,delete"}},
	}}})
	if err == nil {
		err = res.Errors["ratelimit.policy"]
	}
	if err != nil {
		t.Fatalf("create the topic: %v", err)
	}

	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	for _, args := range [][]string{
		{"policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--author", "alice"},
		{"override", "set", "acct_1", "--tier", "pro", "--reason", "deal", "--author", "billing"},
	} {
		if out, errOut, code := runCLI(t, env, args...); code != 0 {
			t.Fatalf("%v: %d %q %q", args, code, out, errOut)
		}
	}
	p := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "POLICY_CACHE_DIR="+t.TempDir(), "LIMITER_GRPC_ADDR=")...)
	assertUnsafe := func(rev int) {
		t.Helper()
		pol := waitRevision(t, p, rev)
		if pol["status"] != "unsafe" || pol["logError"] != nil {
			t.Fatalf("at revision %d on a topic that can delete: %v, want status unsafe and no logError", rev, pol)
		}
		if why, _ := pol["logUnsafe"].(string); !strings.Contains(why, "cleanup.policy=compact,delete (want compact)") {
			t.Fatalf("policy.logUnsafe %q does not name cleanup.policy", why)
		}
		var r map[string]any
		if err := testenv.Poll(30*time.Second, func() bool { // a late fleet heartbeat shows until the next
			r = p.readyz(t)
			return r["httpStatus"] == 200 && r["status"] == "ok"
		}); err != nil {
			t.Fatalf("/readyz answered %v status %v on an unsafe topic, want 200 and ok (the limiter enforces what it read; status is the store's)", r["httpStatus"], r["status"])
		}
		if n := p.metric(t, "limiter_policy_log_unsafe "); n != 1 {
			t.Fatalf("limiter_policy_log_unsafe = %v, want 1", n)
		}
		if d, code := p.check(t, "acct_1", "x", 1); code != 200 || d.Policy != "override:acct_1" || d.Limit != 200 {
			t.Fatalf("acct_1: %d %+v, want its override's pro limit", code, d)
		}
	}
	assertUnsafe(2)
	if d, code := p.check(t, "acct_2", "x", 1); code != 200 || d.Limit != 20 {
		t.Fatalf("acct_2: %d %+v, want the log's free tier (burst 20), not the bootstrap's", code, d)
	}
	if !strings.Contains(p.logs.String(), "the policy log can lose records") {
		t.Fatalf("no log line says the topic can lose records:\n%s", p.logs.String())
	}

	// Still followed: a new revision is applied, and the topic is still
	// unsafe.
	if out, errOut, code := runCLI(t, env, "override", "set", "acct_2", "--tier", "pro", "--reason", "deal", "--author", "billing"); code != 0 {
		t.Fatalf("override set acct_2: %d %q %q", code, out, errOut)
	}
	assertUnsafe(3)
	if d, code := p.check(t, "acct_2", "x", 1); code != 200 || d.Policy != "override:acct_2" {
		t.Fatalf("acct_2 after revision 3: %d %+v, want its override", code, d)
	}
	// Applied once: an unsafe topic is no new revision. The pause spans
	// several reads of the log (each waits up to 500 ms for a record); a
	// slower machine reads fewer times, never more.
	time.Sleep(2 * time.Second)
	if n := strings.Count(p.logs.String(), `"msg":"policy revision applied"`); n != 1 {
		t.Fatalf("%d lines \"policy revision applied\" after one new revision, want 1", n)
	}
}
