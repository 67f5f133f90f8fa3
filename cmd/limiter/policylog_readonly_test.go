package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/testenv"
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
