package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyLogFirstPushReachesAFleetStartedWithoutTopic: a fleet started
// before its policy topic exists (the first deployment) applies the first
// push within a second (docs/policy-log.md). What makes that true is
// controlled, and asserted: a follower asks again for a missing topic
// every MissingTopicRetry, and its log answers from fresh metadata
// (kafkalog's TestMissingTopicSeenAtTheNextQuestion). End to end, three
// limiters started on a broker without the topic reach the first push's
// revision within 3 s × RATEWARDEN_TEST_TIMEOUT_SCALE of the push
// returning: room for a busy machine, short of the 3 to 8 s a fleet took
// while it waited for its cached metadata to expire.
func TestPolicyLogFirstPushReachesAFleetStartedWithoutTopic(t *testing.T) {
	t.Parallel()
	if policylog.MissingTopicRetry > 250*time.Millisecond || policylog.MissingTopicRetry <= 0 {
		t.Fatalf("MissingTopicRetry %s: a fleet waiting for its first push must look several times a second", policylog.MissingTopicRetry)
	}
	k := testenv.StartKafka(t, "ratelimit.decisions", 1) // no policy topic
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	var fleet []*limiterProc
	for i := range 3 {
		fleet = append(fleet, startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka",
			fmt.Sprintf("LIMITER_INSTANCE_ID=l%d", i), "LIMITER_GRPC_ADDR=")...))
	}
	for _, p := range fleet {
		if pol := p.policyOf(t); pol["source"] != "bootstrap" {
			t.Fatalf("a limiter started without the topic: %v, want the bootstrap file", pol)
		}
	}
	out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--no-replay")
	pushed := time.Now()
	if code != 0 || !strings.Contains(out, "applied: revision 1") {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	deadline := testenv.Timeout(3 * time.Second)
	var wg sync.WaitGroup
	took := make([]time.Duration, len(fleet))
	for i, p := range fleet {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if pol := p.policyOf(t); pol["revision"] == float64(1) && pol["source"] == "kafka" {
					took[i] = time.Since(pushed)
					return
				}
				if time.Since(pushed) > deadline {
					t.Errorf("%s: not at revision 1 %s after the first push: %v", p.url, deadline, p.policyOf(t))
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	t.Logf("the first push applied by each limiter after %v", took)
}
