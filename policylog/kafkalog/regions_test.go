package kafkalog_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestEveryRegionFollowsOneLog: the limiters of regions a, b and c follow
// one ratelimit.policy topic (each its own reader and policy cache), and
// every revision reaches all three with the same content. Region b cut off
// from the log: a limiter starting there starts from its cache at the
// revision in force everywhere; healed, it reads the log again.
func TestEveryRegionFollowsOneLog(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	c := ctx(t)
	w := policylog.NewClient(open(t, k), true)
	if err := open(t, k).Ensure(c); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Push(c, docA, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	follower := func(brokers []string, cache string) *policylog.Follower {
		l, err := kafkalog.New(kafkalog.Config{Brokers: brokers, Topic: "ratelimit.policy", Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return policylog.NewFollower(policylog.FollowerConfig{Log: l, Topic: "ratelimit.policy", CacheDir: cache, StartWait: 500 * time.Millisecond,
			Metrics: policylog.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}
	caches := map[string]string{}
	followers := map[string]*policylog.Follower{}
	stops := map[string]context.CancelFunc{}
	for _, r := range []string{"a", "b", "c"} {
		caches[r] = t.TempDir()
		f := follower([]string{k.Addr()}, caches[r])
		if _, err := f.Start(c); err != nil {
			t.Fatal(err)
		}
		if got := f.Current(); got.Source != policylog.SourceKafka || got.Revision != 1 {
			t.Fatalf("region %s at start: %+v", r, got)
		}
		f.Target = discard{}
		rctx, cancel := context.WithCancel(c)
		done := make(chan error, 1)
		go func() { done <- f.Run(rctx) }()
		var once sync.Once
		stops[r] = func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stops[r])
		followers[r] = f
	}
	if _, err := w.SetOverride(c, "acct_1", "", policy.Override{Tier: "pro", Reason: "upgrade"}, "bob", "upgrade", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Timeout(30 * time.Second))
	for _, r := range []string{"a", "b", "c"} {
		for followers[r].Revision() != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("region %s did not reach revision 2: %+v", r, followers[r].Current())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	hash := followers["a"].Current().Hash
	for _, r := range []string{"b", "c"} {
		if got := followers[r].Current(); got.Hash != hash || got.Overrides != 1 {
			t.Fatalf("region %s holds %+v, region a %s", r, got, hash)
		}
	}

	// Region b cut off: its next limiter cannot reach the log.
	stops["b"]()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	cut := follower([]string{dead}, caches["b"])
	if _, err := cut.Start(c); err != nil {
		t.Fatal(err)
	}
	if got := cut.Current(); got.Source != policylog.SourceCache || got.Revision != 2 || got.Hash != hash {
		t.Fatalf("region b cut off starts from %+v, want its cache at revision 2 (%s)", got, hash)
	}
	// Healed.
	healed := follower([]string{k.Addr()}, caches["b"])
	if _, err := healed.Start(c); err != nil {
		t.Fatal(err)
	}
	if got := healed.Current(); got.Source != policylog.SourceKafka || got.Revision != 2 || got.Hash != hash {
		t.Fatalf("region b healed: %+v", got)
	}
}

// discard is a Follower's target that keeps nothing: the test reads the
// follower's own Current.
type discard struct{}

func (discard) SetPolicy(enforcement.Policy) {}
