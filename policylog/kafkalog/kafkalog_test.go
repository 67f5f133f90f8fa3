package kafkalog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const docA = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n  pro: { rate: 100, burst: 200 }\n"
const docB = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 11, burst: 22 }\n  pro: { rate: 100, burst: 200 }\n"

func open(t *testing.T, k *testenv.Kafka) *kafkalog.Log {
	t.Helper()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Topic: "ratelimit.policy", Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func docRec(yaml, author string) policylog.Record {
	return policylog.Record{Kind: policylog.KindPolicy, Document: yaml, Author: author, Message: "m " + author}
}

// TestWriteReadBack creates the topic (one partition), writes a document
// and an override, and reads both back as applied from a second client.
func TestWriteReadBack(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	l := open(t, k)
	c := ctx(t)
	if err := l.Ensure(c); err != nil {
		t.Fatal(err)
	}
	if err := l.Ensure(c); err != nil { // idempotent
		t.Fatal(err)
	}
	w := policylog.NewClient(l, true)
	o, err := w.Write(c, docRec(docA, "alice"), policylog.NoExpect)
	if err != nil || o.Head != 1 {
		t.Fatalf("push: %+v %v", o, err)
	}
	o, err = w.Write(c, policylog.Record{Kind: policylog.KindOverride, Key: "acct/1", Scope: "api:search", Override: &policy.Override{Tier: "pro", Reason: "upgrade"}, Author: "bob"}, policylog.NoExpect)
	if err != nil || o.Head != 2 {
		t.Fatalf("override: %+v %v", o, err)
	}
	_, err = w.Write(c, policylog.Record{Kind: policylog.KindOverride, Key: "acct_2", Override: &policy.Override{Tier: "gold", Reason: "x"}}, policylog.NoExpect)
	var ref *policylog.Refusal
	if !errors.As(err, &ref) || ref.Outcome.Code != policylog.CodeInvalid {
		t.Fatalf("undefined tier: %v", err)
	}
	r := policylog.NewClient(open(t, k), true)
	if err := r.Sync(c); err != nil {
		t.Fatal(err)
	}
	if r.State().Head() != 2 {
		t.Fatalf("reader head %d", r.State().Head())
	}
	if rec, ok := r.State().Override("acct/1", "api:search"); !ok || rec.Author != "bob" {
		t.Fatalf("override read back: %+v %v", rec, ok)
	}
}

// TestRacingWriters: two writers with the same expected revision; exactly
// one is applied, the other is told who took the revision, and every
// reader — also after compaction — holds the winner.
func TestRacingWriters(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	c := ctx(t)
	first := policylog.NewClient(open(t, k), true)
	if err := open(t, k).Ensure(c); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Write(c, docRec(docA, "alice"), policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		base := int64(1 + round)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, who := range []string{"bob", "carol"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := policylog.NewClient(open(t, k), true)
				yaml := docA
				if i == 1 {
					yaml = docB
				}
				yaml += "# round " + string(rune('0'+round)) + " " + who + "\n"
				_, errs[i] = w.Write(c, docRec(yaml, who), base)
			}()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
				continue
			}
			var ref *policylog.Refusal
			if !errors.As(err, &ref) || ref.Outcome.Code != policylog.CodeConflict {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d writes applied, want exactly 1 (%v)", round, ok, errs)
		}
	}
	full := policylog.NewClient(open(t, k), true)
	if err := full.Sync(c); err != nil {
		t.Fatal(err)
	}
	if full.State().Head() != 6 {
		t.Fatalf("head %d, want 6", full.State().Head())
	}
	k.Cluster().Compact()
	compacted := policylog.NewClient(open(t, k), true)
	if err := compacted.Sync(c); err != nil {
		t.Fatal(err)
	}
	_, a := full.State().Document()
	_, b := compacted.State().Document()
	for _, h := range full.History() {
		t.Logf("full %d %s %s rev %d restates %v %s %s", h.Offset, h.Result, h.Code, h.Revision, h.Restates, h.SHA256[:8], h.Author)
	}
	for _, h := range compacted.History() {
		t.Logf("comp %d %s %s rev %d restates %v %s", h.Offset, h.Result, h.Code, h.Revision, h.Restates, h.SHA256[:8])
	}
	if compacted.State().Head() != 6 || a.SHA256 != b.SHA256 {
		t.Fatalf("after compaction: head %d doc %s; full log: head 6 doc %s", compacted.State().Head(), b.SHA256, a.SHA256)
	}
	if len(compacted.History()) >= len(full.History()) {
		t.Fatalf("compaction removed nothing (%d entries)", len(full.History()))
	}
}

// TestConcurrentOverrideWriters: 4 writers each set 25 overrides on keys
// of their own, at once, without an expected revision: all 100 are
// applied (a writer that loses a revision to another key's record
// rebases), and every reader, of the full log and of the compacted one,
// holds the same 100 overrides.
func TestConcurrentOverrideWriters(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	c := ctx(t)
	if err := open(t, k).Ensure(c); err != nil {
		t.Fatal(err)
	}
	if _, err := policylog.NewClient(open(t, k), true).Write(c, docRec(docA, "alice"), policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := policylog.NewClient(open(t, k), true)
			for i := range each {
				key := fmt.Sprintf("acct_w%d_%02d", w, i)
				_, err := cl.SetOverride(c, key, "", policy.Override{Tier: "pro", Reason: "billing"}, fmt.Sprintf("writer%d", w), "upgrade", policylog.NoExpect)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", key, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	full := policylog.NewClient(open(t, k), false)
	if err := full.Sync(c); err != nil {
		t.Fatal(err)
	}
	if got := full.State().Overrides(); got != writers*each {
		t.Fatalf("%d overrides in force, want %d", got, writers*each)
	}
	k.Cluster().Compact()
	compacted := policylog.NewClient(open(t, k), false)
	if err := compacted.Sync(c); err != nil {
		t.Fatal(err)
	}
	if a, b := full.State().Digest(), compacted.State().Digest(); a != b || compacted.State().Head() != full.State().Head() {
		t.Fatalf("compacted reader: head %d digest %s; full: head %d digest %s", compacted.State().Head(), b, full.State().Head(), a)
	}
}

// TestIntegrity: the topic Ensure creates cannot lose records; a topic
// created by someone else with delete retention is reported, and so is a
// log whose start retention removed, by CheckIntegrity and by a
// follower's /readyz status.
func TestIntegrity(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	c := ctx(t)
	l := open(t, k)
	if err := l.Ensure(c); err != nil {
		t.Fatal(err)
	}
	if first, err := l.CheckIntegrity(c); err != nil || first != 0 {
		t.Fatalf("the topic Ensure created: first %d, %v", first, err)
	}
	w := policylog.NewClient(l, true)
	if _, err := w.Write(c, docRec(docA, "alice"), policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	if f := follow(t, l); f.Current().Status != policylog.StatusOK {
		t.Fatalf("a safe topic: %+v", f.Current())
	}

	// Created by someone else, compacted and deleted after 7 days.
	if err := k.Cluster().CreateTopic("other.policy", 1, map[string]string{"cleanup.policy": "compact,delete", "retention.ms": "604800000"}); err != nil {
		t.Fatal(err)
	}
	other, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Topic: "other.policy", Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	_, err = other.CheckIntegrity(c)
	if !errors.Is(err, policylog.ErrLogUnsafe) || !strings.Contains(err.Error(), "cleanup.policy=compact,delete") || !strings.Contains(err.Error(), "retention.ms=604800000") {
		t.Fatalf("a topic with delete retention: %v", err)
	}
	if _, err := policylog.NewClient(other, true).Write(c, docRec(docA, "alice"), policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	if f := follow(t, other); f.Current().Status != policylog.StatusUnsafe || !strings.Contains(f.Current().LogUnsafe, "cleanup.policy") {
		t.Fatalf("a follower of a topic with delete retention: %+v", f.Current())
	}

	// Retention removed the start of the log (its configuration put back
	// afterwards): the start is not compaction's.
	for i := range 5 {
		if _, err := w.SetOverride(c, fmt.Sprintf("acct_%d", i), "", policy.Override{Tier: "pro", Reason: "r"}, "bob", "m", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	alter := func(bytes string) {
		cl := &kafka.Client{Addr: kafka.TCP(k.Addr()), Timeout: 10 * time.Second}
		res, err := cl.AlterConfigs(c, &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: "ratelimit.policy",
			Configs: []kafka.AlterConfigRequestConfig{{Name: "cleanup.policy", Value: "compact"}, {Name: "retention.ms", Value: "-1"}, {Name: "retention.bytes", Value: bytes}},
		}}})
		if err == nil {
			for _, e := range res.Errors {
				err = errors.Join(err, e)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	alter("1")
	k.Cluster().ApplyRetention()
	alter("-1")
	first, err := l.CheckIntegrity(c)
	if err != nil || first == 0 {
		t.Fatalf("after retention: first %d, %v", first, err)
	}
	if f := follow(t, l); f.Current().Status != policylog.StatusUnsafe || !strings.Contains(f.Current().LogUnsafe, "starts at offset") {
		t.Fatalf("a follower of a log retention cut: %+v", f.Current())
	}
}

func follow(t *testing.T, l *kafkalog.Log) *policylog.Follower {
	t.Helper()
	boot := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(boot, []byte(docA), 0o600); err != nil {
		t.Fatal(err)
	}
	f := policylog.NewFollower(policylog.FollowerConfig{
		Log: l, Topic: l.Topic(), StartWait: 10 * time.Second, Bootstrap: boot,
		Metrics: policylog.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if _, err := f.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return f
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// A reader that found the topic missing sees it at its next question once
// a writer has created it: not when its cached metadata expires (the
// limiters of a fleet started before its first push took 3 to 8 s to
// apply that push). Exists and Fetch, each asked once after the topic
// exists; nothing here waits.
func TestMissingTopicSeenAtTheNextQuestion(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	reader, writer := open(t, k), open(t, k)
	c := ctx(t)
	if err := reader.Exists(c); !errors.Is(err, policylog.ErrNoTopic) {
		t.Fatalf("Exists before any writer: %v, want ErrNoTopic", err)
	}
	if _, _, err := reader.Fetch(c, 0); !errors.Is(err, policylog.ErrNoTopic) {
		t.Fatalf("Fetch before any writer: %v, want ErrNoTopic", err)
	}
	if err := writer.Ensure(c); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Append(c, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := reader.Exists(c); err != nil {
		t.Fatalf("Exists once a writer created the topic: %v", err)
	}
	entries, end, err := reader.Fetch(c, 0)
	if err != nil || end != 1 || len(entries) != 1 {
		t.Fatalf("Fetch once a writer created the topic and appended a record: %d entries, end %d, %v", len(entries), end, err)
	}
}
