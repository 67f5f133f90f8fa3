package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyLogReadOnlyVerbsCreateNothing: on a topic that does not exist
// (a mistyped POLICY_TOPIC), every verb that only reads exits 1 with one
// line naming the topic, and the topic is still absent afterwards.
func TestPolicyLogReadOnlyVerbsCreateNothing(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	const topic = "ratelimit.polcy" // mistyped
	env := []string{"KAFKA_BROKERS=" + k.Addr(), "POLICY_TOPIC=" + topic}
	for _, args := range [][]string{
		{"policy", "history"},
		{"policy", "show"},
		{"policy", "diff", "1", "2"},
		{"override", "get", "acct_1"},
		{"override", "list"},
		{"fleet", "status", "--limiters", "http://127.0.0.1:1"},
	} {
		out, errOut, code := runCLI(t, env, args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 1 || out != "" || len(lines) != 1 || !strings.Contains(errOut, topic) || !strings.Contains(errOut, "does not exist") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and one line naming the missing topic", args, code, out, errOut)
		}
	}
	cl := &kafka.Client{Addr: kafka.TCP(k.Addr()), Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range md.Topics {
		if tp.Name == topic {
			t.Fatalf("a read-only verb created topic %s", topic)
		}
	}
}

// TestPolicyLogConcurrentOverrideWriters: four writers, each a loop of 25
// `limiter override set` processes on keys of its own, all at once: all
// 100 are applied (a writer that loses its revision to another key is
// rebased), and a limiter following the log holds the 100 overrides.
func TestPolicyLogConcurrentOverrideWriters(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first"); code != 0 {
		t.Fatalf("push: %q %q", out, errOut)
	}
	const writers, each = 4, 25
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := fmt.Sprintf("acct_w%d_%02d", w, i)
				out, errOut, code := runCLI(t, env, "override", "set", key, "--tier", "pro", "--reason", "billing", "--author", fmt.Sprintf("writer%d", w))
				if code != 0 || !strings.Contains(out, "applied: revision") {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%s: %d %q %q", key, code, out, errOut))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of %d writes not applied:\n%s", len(failed), writers*each, strings.Join(failed, "\n"))
	}
	p := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")...)
	if pol := waitRevision(t, p, 1+writers*each); pol["overrides"] != float64(writers*each) {
		t.Fatalf("the limiter holds %v overrides, want %d", pol["overrides"], writers*each)
	}
}
