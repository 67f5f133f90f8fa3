package policylog_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// memLog is a policy log in memory: one partition, safe for concurrent
// use. Fetch waits briefly for new records, as the broker does; down
// makes every call fail, as an unreachable broker does.
type memLog struct {
	mu      sync.Mutex
	entries []policylog.Entry
	down    bool
	closed  bool
	changed chan struct{}
	// batch, when set, is the most entries one Fetch returns (a broker
	// answers a long log in several fetches).
	batch int
}

func newMemLog() *memLog { return &memLog{changed: make(chan struct{})} }

var errDown = errors.New("broker unreachable")

func (l *memLog) Append(_ context.Context, key string, value []byte) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return 0, errDown
	}
	off := int64(len(l.entries))
	l.entries = append(l.entries, policylog.Entry{Offset: off, Key: key, Value: value})
	close(l.changed)
	l.changed = make(chan struct{})
	return off, nil
}

func (l *memLog) Fetch(ctx context.Context, from int64) ([]policylog.Entry, int64, error) {
	l.mu.Lock()
	if l.down {
		l.mu.Unlock()
		return nil, 0, errDown
	}
	end := int64(len(l.entries))
	if from >= end {
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		l.mu.Lock()
		end = int64(len(l.entries))
	}
	defer l.mu.Unlock()
	if from >= end {
		return nil, end, nil
	}
	to := end
	if l.batch > 0 {
		to = min(end, from+int64(l.batch))
	}
	return append([]policylog.Entry(nil), l.entries[from:to]...), end, nil
}

func (l *memLog) Exists(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return errDown
	}
	return nil
}

func (l *memLog) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

func (l *memLog) setDown(down bool) {
	l.mu.Lock()
	l.down = down
	l.mu.Unlock()
}

// wipe empties the log, as a broker that kept nothing.
func (l *memLog) wipe() {
	l.mu.Lock()
	l.entries = nil
	l.mu.Unlock()
}

// target records the policies a follower swaps in.
type target struct {
	mu  sync.Mutex
	got []enforcement.Policy
}

func (t *target) SetPolicy(p enforcement.Policy) {
	t.mu.Lock()
	t.got = append(t.got, p)
	t.mu.Unlock()
}

const (
	followDoc = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n  pro:  { rate: 100, burst: 200 }\n"
	bootDoc   = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 3 }\n"
)

func newFollower(t *testing.T, l policylog.FollowedLog, cacheDir string) *policylog.Follower {
	t.Helper()
	boot := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(boot, []byte(bootDoc), 0o600); err != nil {
		t.Fatal(err)
	}
	return policylog.NewFollower(policylog.FollowerConfig{
		Log: l, Topic: "ratelimit.policy", CacheDir: cacheDir, StartWait: 300 * time.Millisecond, Bootstrap: boot,
		Metrics: policylog.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

func pro() policy.Override { return policy.Override{Tier: "pro", Reason: "test"} }

// waitFor polls cond (the follower's goroutine publishes asynchronously);
// the bound is generous, never a measure of speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(20 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFollowerStartsFromLogCacheOrBootstrap: the log's policy when the log
// can be read, the cache's when it cannot, the bootstrap's with neither.
func TestFollowerStartsFromLogCacheOrBootstrap(t *testing.T) {
	ctx := context.Background()
	l := newMemLog()
	cache := t.TempDir()

	// An empty log: the bootstrap file.
	f := newFollower(t, l, cache)
	if _, err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.Current(); got.Source != policylog.SourceBootstrap || got.Revision != 0 {
		t.Fatalf("empty log: %+v", got)
	}

	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, followDoc, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	if _, err := w.SetOverride(ctx, "acct_1", "", pro(), "alice", "upgrade", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	f = newFollower(t, l, cache)
	if _, err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.Current(); got.Source != policylog.SourceKafka || got.Revision != 2 || got.Overrides != 1 || got.Author != "alice" {
		t.Fatalf("from the log: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(cache, policylog.CacheFile)); err != nil {
		t.Fatalf("no cache written: %v", err)
	}

	l.setDown(true)
	f = newFollower(t, l, cache)
	p, err := f.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Current(); got.Source != policylog.SourceCache || got.Revision != 2 || got.Overrides != 1 {
		t.Fatalf("from the cache: %+v", got)
	}
	if r, err := p.Resolve("acct_1", "", ""); err != nil || r.Tier != "pro" {
		t.Fatalf("the cached override is not in force: %+v %v", r, err)
	}

	f = newFollower(t, l, "")
	if _, err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.Current(); got.Source != policylog.SourceBootstrap {
		t.Fatalf("unreachable, no cache: %+v", got)
	}
}

// TestFollowerRunAppliesAndRecovers: Run swaps in each new revision,
// keeps the policy in force while the log cannot be read (saying so in
// LogError), and clears the error once it reads again.
func TestFollowerRunAppliesAndRecovers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	l := newMemLog()
	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, followDoc, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	f := newFollower(t, l, t.TempDir())
	if _, err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tg := &target{}
	f.Target = tg
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	if _, err := w.SetOverride(ctx, "acct_1", "", pro(), "bob", "upgrade", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "revision 2", func() bool { return f.Revision() == 2 })
	tg.mu.Lock()
	last := tg.got[len(tg.got)-1]
	tg.mu.Unlock()
	if r, err := last.Resolve("acct_1", "", ""); err != nil || r.Tier != "pro" {
		t.Fatalf("revision 2 swapped in without its override: %+v %v", r, err)
	}

	l.setDown(true)
	waitFor(t, "a log error", func() bool { return f.Current().LogError != "" })
	if got := f.Current(); got.Revision != 2 || got.Source != policylog.SourceKafka {
		t.Fatalf("while the log is down: %+v", got)
	}
	l.setDown(false)
	waitFor(t, "the error cleared", func() bool { return f.Current().LogError == "" })

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if !closed {
		t.Fatal("Run did not close the log")
	}
}

// TestFollowerKeepsRevisionWhenLogStartsOver: a log lost under a running
// follower (and a push of revision 1 on the empty log) never replaces the
// revision in force: the follower says it is stale, until a restore writes
// an epoch record carrying the whole state; it then applies it, with the
// digest it had. A follower started afresh on the lost log, from its
// cache, is stale as well: every limiter agrees.
func TestFollowerKeepsRevisionWhenLogStartsOver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newMemLog()
	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, followDoc, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"acct_1", "acct_2", "acct_3"} {
		if _, err := w.SetOverride(ctx, k, "", pro(), "alice", "upgrade", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	cache := t.TempDir()
	f := newFollower(t, l, cache)
	if _, err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tg := &target{}
	f.Target = tg
	go f.Run(ctx)
	before := f.Current()
	if before.Revision != 4 || before.Digest == "" || before.Status != policylog.StatusOK {
		t.Fatalf("before: %+v", before)
	}
	held := w.State() // what the audit or a cache would hold

	l.wipe()
	// A careless push on the empty log: revision 1, no overrides.
	careless := policylog.NewClient(l, true)
	if _, err := careless.Push(ctx, followDoc, "bob", "start again", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stale", func() bool { return f.Current().Status == policylog.StatusStale })
	if got := f.Current(); got.Revision != 4 || got.Overrides != 3 || got.Digest != before.Digest || got.LogError == "" {
		t.Fatalf("after the log started over: %+v", got)
	}
	tg.mu.Lock()
	swaps := len(tg.got)
	tg.mu.Unlock()
	if swaps != 0 {
		t.Fatalf("the started-over log was swapped in %d times", swaps)
	}
	// A limiter started now, from its cache, on the lost log: stale too.
	g := newFollower(t, l, cache)
	if _, err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := g.Current(); got.Status != policylog.StatusStale || got.Revision != 4 || got.Digest != before.Digest {
		t.Fatalf("a limiter started on the lost log: %+v", got)
	}

	// The cache holds the same state as the audit would.
	cs, err := policylog.CacheState(cache, "ratelimit.policy")
	if err != nil {
		t.Fatal(err)
	}
	if cs.Digest() != before.Digest || cs.Head() != 4 || cs.Overrides() != 3 {
		t.Fatalf("the cache's state: head %d, %d overrides, digest %s, want %s", cs.Head(), cs.Overrides(), cs.Digest(), before.Digest)
	}
	if _, err := policylog.EpochRecord(cs, 1, "carol", "from the cache"); err != nil {
		t.Fatal(err)
	}

	// The restore: an epoch record with the whole state.
	o, err := careless.Restore(ctx, held, "carol", "restore after the broker was rebuilt")
	if err != nil {
		t.Fatal(err)
	}
	if o.Head != 4 || careless.State().Epoch() != 1 {
		t.Fatalf("restore: %+v epoch %d", o, careless.State().Epoch())
	}
	waitFor(t, "the restore applied", func() bool { return f.Current().Status == policylog.StatusOK && f.Current().Epoch == 1 })
	if got := f.Current(); got.Revision != 4 || got.Digest != before.Digest || got.Overrides != 3 {
		t.Fatalf("after the restore: %+v, want the digest %s", got, before.Digest)
	}
	// Writes go on from the restored head.
	if o, err := careless.SetOverride(ctx, "acct_4", "", pro(), "carol", "new", policylog.NoExpect); err != nil || o.Head != 5 {
		t.Fatalf("write after restore: %+v %v", o, err)
	}
	waitFor(t, "revision 5", func() bool { return f.Revision() == 5 })
	// A reader of the whole new log reaches the same state.
	r := policylog.NewClient(l, false)
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if r.State().Head() != 5 || r.State().Digest() != f.Current().Digest {
		t.Fatalf("a fresh reader: head %d digest %s, follower %+v", r.State().Head(), r.State().Digest(), f.Current())
	}
	// A second restore of the same state is refused: the log is past it.
	if _, err := careless.Restore(ctx, held, "carol", "again"); err == nil {
		t.Fatal("a restore below the head was written")
	}
}

// racingLog runs before once, just before the first Append: another
// writer's record lands between a writer's read and its write.
type racingLog struct {
	*memLog
	once   sync.Once
	before func()
}

func (l *racingLog) Append(ctx context.Context, key string, value []byte) (int64, error) {
	l.once.Do(l.before)
	return l.memLog.Append(ctx, key, value)
}

// TestWriterRebasesOnlyOtherKeys: a writer that loses its revision to a
// record of another key is rebased and applied; to a record of its own
// key, it is refused, naming who wrote what.
func TestWriterRebasesOnlyOtherKeys(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		otherKey string
		applied  bool
	}{{"acct_other", true}, {"acct_1", false}} {
		l := newMemLog()
		setup := policylog.NewClient(l, true)
		if _, err := setup.Push(ctx, followDoc, "alice", "first", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
		rl := &racingLog{memLog: l}
		rl.before = func() {
			other := policylog.NewClient(l, true)
			if _, err := other.SetOverride(ctx, tc.otherKey, "", pro(), "bob", "bob's change", policylog.NoExpect); err != nil {
				t.Error(err)
			}
		}
		w := policylog.NewClient(rl, true)
		o, err := w.SetOverride(ctx, "acct_1", "", pro(), "carol", "carol's change", policylog.NoExpect)
		if tc.applied {
			if err != nil || o.Head != 3 {
				t.Fatalf("%s: %+v %v", tc.otherKey, o, err)
			}
			continue
		}
		var ref *policylog.Refusal
		if !errors.As(err, &ref) || o.Code != policylog.CodeConflict || !strings.Contains(o.Reason, "bob") || !strings.Contains(o.Reason, "bob's change") {
			t.Fatalf("same key: %+v %v", o, err)
		}
		if r, ok := w.State().Override("acct_1", ""); !ok || r.Author != "bob" {
			t.Fatalf("the override in force: %+v %v", r, ok)
		}
	}
}
