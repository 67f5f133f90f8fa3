package opsapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestReadsCreateNoTopic: on a policy topic that does not exist (a
// mistyped POLICY_TOPIC), the operator API's reads answer 503 saying so,
// a limiter's follower starts from its bootstrap file with /readyz's
// policy failing for that reason and keeps reading, and none of them
// creates the topic; the first write does, and the follower then
// switches to the log.
func TestReadsCreateNoTopic(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	const topic = "ratelimit.polcy"
	open := func() *kafkalog.Log {
		l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Topic: topic, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	exists := func() bool {
		// A transport of its own: the default one caches metadata.
		tr := &kafka.Transport{}
		defer tr.CloseIdleConnections()
		cl := &kafka.Client{Addr: kafka.TCP(k.Addr()), Timeout: 10 * time.Second, Transport: tr}
		md, err := cl.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range md.Topics {
			if tp.Name == topic && tp.Error == nil {
				return true
			}
		}
		return false
	}

	boot := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(boot, []byte(docA), 0o600); err != nil {
		t.Fatal(err)
	}
	f := policylog.NewFollower(policylog.FollowerConfig{Log: open(), Topic: topic, StartWait: 5 * time.Second, Bootstrap: boot,
		Metrics: policylog.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if _, err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cur := f.Current(); cur.Source != policylog.SourceBootstrap || cur.Status != policylog.StatusFailing || !strings.Contains(cur.LogError, "does not exist") || !strings.Contains(cur.LogError, topic) {
		t.Fatalf("the follower started with %+v, want the bootstrap file and a policy error naming the missing topic", cur)
	}
	f.Target = nopTarget{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	h, err := newHandler(open())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	a := api{t, srv.URL}
	for _, path := range []string{"/v1/admin/policy", "/v1/admin/policy/history", "/v1/admin/overrides", "/v1/admin/overrides/acct_1"} {
		code, body := a.do("GET", path, admin, "")
		msg, _ := body["error"].(map[string]any)["message"].(string)
		if code != 503 || !strings.Contains(msg, "does not exist") || !strings.Contains(msg, topic) {
			t.Errorf("GET %s on a missing topic: %d %v", path, code, body)
		}
	}
	time.Sleep(300 * time.Millisecond) // the follower polls meanwhile
	if exists() {
		t.Fatal("a read created the topic")
	}
	if code, body := a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "first"})); code != 200 {
		t.Fatalf("the first write: %d %v", code, body)
	}
	if !exists() {
		t.Fatal("the first write did not create the topic")
	}
	for deadline := time.Now().Add(testenv.Timeout(30 * time.Second)); f.Current().Source != policylog.SourceKafka; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower never read the log: %+v", f.Current())
		}
	}
	if cur := f.Current(); cur.Status != policylog.StatusOK || cur.Revision != 1 {
		t.Fatalf("after the first write: %+v", cur)
	}
}

func newHandler(l *kafkalog.Log) (*opsapi.Handler, error) {
	return opsapi.New(opsapi.Config{AdminToken: admin, Log: l})
}

type nopTarget struct{}

func (nopTarget) SetPolicy(enforcement.Policy) {}
