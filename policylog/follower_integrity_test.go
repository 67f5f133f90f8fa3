package policylog_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/policylog"
)

// checkedLog is a memLog with an integrity check: a topic that can
// delete records while unsafe is set. checks counts the checks.
type checkedLog struct {
	*memLog
	unsafe atomic.Bool
	checks atomic.Int64
}

func (l *checkedLog) CheckIntegrity(context.Context) (int64, error) {
	l.checks.Add(1)
	if l.unsafe.Load() {
		return 0, fmt.Errorf("%w: topic ratelimit.policy has cleanup.policy=compact,delete (want compact)", policylog.ErrLogUnsafe)
	}
	return 0, nil
}

// TestFollowerUnsafeTopic: a follower of a topic that can delete records
// is "unsafe" from its start, applies each revision once (an unsafe
// topic is no new revision to swap in at every read), and follows the
// topic's verdict at each periodic check, both ways. A read failure while
// unsafe leaves no stale verdict behind once the topic is fixed.
func TestFollowerUnsafeTopic(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := &checkedLog{memLog: newMemLog()}
	l.unsafe.Store(true)
	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, followDoc, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	if _, err := w.SetOverride(ctx, "acct_1", "", pro(), "alice", "upgrade", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	boot := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(boot, []byte(bootDoc), 0o600); err != nil {
		t.Fatal(err)
	}
	f := policylog.NewFollower(policylog.FollowerConfig{
		Log: l, Topic: "ratelimit.policy", CacheDir: t.TempDir(), StartWait: 10 * time.Second, Bootstrap: boot,
		Metrics: policylog.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CheckEvery: time.Nanosecond, // at every read that reaches the end
	})
	if _, err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.Current(); got.Status != policylog.StatusUnsafe || got.Revision != 2 || !strings.Contains(got.LogUnsafe, "cleanup.policy") || got.LogError != "" {
		t.Fatalf("at start on a topic that can delete: %+v", got)
	}
	tg := &target{}
	f.Target = tg
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	applied := func() int {
		tg.mu.Lock()
		defer tg.mu.Unlock()
		return len(tg.got)
	}
	// reads waits for n more reads that reached the end of the log (each
	// is followed by a check).
	reads := func(n int64) {
		t.Helper()
		from := l.checks.Load()
		waitFor(t, fmt.Sprintf("%d checks", n), func() bool { return l.checks.Load() >= from+n })
	}

	reads(5)
	if n := applied(); n != 0 {
		t.Fatalf("revision 2, in force since the start, swapped in again %d times", n)
	}
	if _, err := w.SetOverride(ctx, "acct_2", "", pro(), "alice", "upgrade", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "revision 3", func() bool { return f.Revision() == 3 })
	reads(5)
	if n := applied(); n != 1 {
		t.Fatalf("revision 3 swapped in %d times, want once", n)
	}
	if got := f.Current(); got.Status != policylog.StatusUnsafe || got.Revision != 3 {
		t.Fatalf("at revision 3: %+v", got)
	}

	// The periodic check, both ways.
	l.unsafe.Store(false)
	waitFor(t, "ok once the topic is fixed", func() bool { return f.Current().Status == policylog.StatusOK })
	if got := f.Current(); got.LogUnsafe != "" {
		t.Fatalf("the topic fixed: %+v", got)
	}
	l.unsafe.Store(true)
	waitFor(t, "unsafe again", func() bool { return f.Current().Status == policylog.StatusUnsafe })

	// Unreadable while unsafe, then readable, then fixed.
	l.setDown(true)
	waitFor(t, "failing", func() bool { return f.Current().Status == policylog.StatusFailing })
	l.setDown(false)
	waitFor(t, "unsafe after the failure", func() bool { return f.Current().Status == policylog.StatusUnsafe })
	l.unsafe.Store(false)
	waitFor(t, "ok once the topic is fixed", func() bool { return f.Current().Status == policylog.StatusOK })
	if got := f.Current(); got.LogUnsafe != "" || got.LogError != "" || got.Revision != 3 {
		t.Fatalf("the topic fixed after a failure: %+v", got)
	}
	if n := applied(); n != 1 {
		t.Fatalf("revision 3 swapped in %d times, want once", n)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
