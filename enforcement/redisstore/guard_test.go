package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The tests here run the chain the limiter binary runs (enforcement.Limiter
// → guard → auto-pipelined EVALSHA) against a real redis-server.

// recorder is a redisstore.Observer that keeps what it is told.
type recorder struct {
	calls, errs atomic.Int64
	mu          sync.Mutex
	firstErrs   []string
	states      []redisstore.State
}

func (r *recorder) StoreCall(_ time.Duration, err error) {
	r.calls.Add(1)
	if err != nil {
		r.errs.Add(1)
		r.mu.Lock()
		if len(r.firstErrs) < 5 {
			r.firstErrs = append(r.firstErrs, err.Error())
		}
		r.mu.Unlock()
	}
}

func (r *recorder) BreakerState(s redisstore.State) {
	r.mu.Lock()
	r.states = append(r.states, s)
	r.mu.Unlock()
}

// client is configured as cmd/limiter configures it.
func client(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 64, MinIdleConns: 8,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// pipelined is the store as cmd/limiter builds it: the pipeline's own
// timeout is LIMITER_STORE_TIMEOUT.
func pipelined(t testing.TB, rdb *redis.Client, prefix string, timeout time.Duration) *redisstore.Pipelined {
	p := redisstore.NewPipelined(rdb, prefix, redisstore.PipelineConfig{Timeout: timeout})
	running(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Store().Preload(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

var roomy = enforcement.Limit{Rate: 1e6, Burst: 1e6}

// starve keeps every core of the machine busy until the test ends with
// stress-ng --cpu N (N = cores), or, where it is not installed, with as many
// spinning goroutines in this process as GOMAXPROCS. Stopped at cleanup. A
// machine already loaded beyond that (load average over 2 per core: make
// stress-test runs this test under stress-ng) is starved enough: stacking a
// second stress-ng on it measures the oversubscription, not the guard.
func starve(t *testing.T) {
	if load := loadAverage(); load > 2*float64(runtime.NumCPU()) {
		t.Logf("load average %.1f on %d cores: already starved, no more load added", load, runtime.NumCPU())
		return
	}
	if path, err := exec.LookPath("stress-ng"); err == nil {
		cmd := exec.Command(path, "--cpu", fmt.Sprint(runtime.NumCPU()), "--timeout", "300s", "--quiet")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	} else {
		t.Log("stress-ng is not installed: starving the process with spinning goroutines")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range runtime.GOMAXPROCS(0) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := 0
				for {
					select {
					case <-stop:
						return
					default:
					}
					for i := range 100000 {
						x += i
					}
				}
			}()
		}
		t.Cleanup(func() { close(stop); wg.Wait() })
	}
	time.Sleep(500 * time.Millisecond) // let the load take hold
}

// loadAverage is the 1-minute load average, 0 where Linux does not report it.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var load float64
	_, _ = fmt.Sscan(string(b), &load)
	return load
}

// TestHealthyStoreOnAStarvedMachineNeverFails: with every core busy,
// fresh limiters hit by 64 decisions at once and then about 2,000
// decisions per second, against a healthy redis-server, decide every one
// of them shared: no store failure, no degraded decision, breaker closed.
// (With a plain 5 ms deadline the same run made hundreds of degraded
// decisions and opened the breaker; BENCHMARKS.md.)
func TestHealthyStoreOnAStarvedMachineNeverFails(t *testing.T) {
	r := testenv.StartRedis(t)
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: std\ntiers:\n  std: { rate: 1000000, burst: 1000000 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	starve(t)
	t.Logf("load average %.1f on %d cores", loadAverage(), runtime.NumCPU())
	const timeout = 5 * time.Millisecond // LIMITER_STORE_TIMEOUT's default
	var decisions, degraded, errs, calls int64
	for round := range 3 {
		rdb := client(t, r.Addr())
		obs := &recorder{}
		g := runningGuard(t, pipelined(t, rdb, fmt.Sprintf("starved%d", round), timeout), redisstore.GuardSettings{Timeout: timeout}, obs, nil)
		lim, err := enforcement.New(enforcement.Config{Authority: g, Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var n, deg atomic.Int64
		stopAt := time.Now().Add(2 * time.Second)
		for w := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(stopAt); i++ {
					d, err := lim.Check(context.Background(), enforcement.Request{Key: fmt.Sprintf("k%d-%d", w, i%32), Scope: "api"})
					if err != nil {
						t.Error(err)
						return
					}
					n.Add(1)
					if d.Source == enforcement.SourceDegraded {
						deg.Add(1)
					}
					time.Sleep(32 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		decisions += n.Load()
		degraded += deg.Load()
		errs += obs.errs.Load()
		calls += obs.calls.Load()
		if obs.errs.Load() > 0 {
			t.Errorf("round %d: %d store failures against a healthy store, first: %v", round, obs.errs.Load(), obs.firstErrs)
		}
		if g.State() != redisstore.Closed {
			t.Errorf("round %d: breaker %v", round, g.State())
		}
	}
	t.Logf("starved machine: %d decisions, %d degraded, %d store calls, %d store failures", decisions, degraded, calls, errs)
	if degraded > 0 {
		t.Errorf("%d of %d decisions degraded against a healthy store", degraded, decisions)
	}
	if decisions < 1000 {
		t.Errorf("only %d decisions in 6 s", decisions)
	}
}

// TestPausedStoreFailsFastAndOpensTheBreaker: a SIGSTOPped redis-server
// answers nothing. Every call ends within the guard's MaxWait (far below
// the client's 1 s read timeout), as ErrStoreUnavailable; the breaker
// opens, after which calls fail at once without asking the store; after
// SIGCONT a probe closes it again.
func TestPausedStoreFailsFastAndOpensTheBreaker(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := client(t, r.Addr())
	obs := &recorder{}
	s := redisstore.GuardSettings{Timeout: 5 * time.Millisecond, OpenFor: 200 * time.Millisecond}
	g := runningGuard(t, pipelined(t, rdb, "paused", s.Timeout), s, obs, nil)
	ctx := context.Background()
	if _, err := g.Take(ctx, "warm", "s", roomy, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer r.Process().Signal(syscall.SIGCONT)

	const maxWait = time.Second // the default
	var slowest time.Duration
	pausedAt := time.Now()
	for i := 0; g.State() != redisstore.Open; i++ {
		if time.Since(pausedAt) > testenv.Timeout(10*time.Second) {
			t.Fatalf("the breaker is still %v 10s into the pause, after %d calls", g.State(), i)
		}
		start := time.Now()
		_, err := g.Take(ctx, fmt.Sprint("p", i), "s", roomy, 1)
		took := time.Since(start)
		slowest = max(slowest, took)
		if !errors.Is(err, redisstore.ErrStoreUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d to a paused store: %v, want ErrStoreUnavailable and no context error", i, err)
		}
		// MaxWait plus a generous margin for a loaded machine running the
		// race detector: a timer firing late, a goroutine scheduled late.
		if took > maxWait+500*time.Millisecond {
			t.Fatalf("call %d to a paused store took %v: MaxWait is %v", i, took, maxWait)
		}
	}
	openAfter := time.Since(pausedAt)
	start := time.Now()
	_, err := g.Take(ctx, "while-open", "s", roomy, 1)
	if !errors.Is(err, redisstore.ErrStoreUnavailable) {
		t.Fatalf("breaker open: %v", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("a call with the breaker open took %v: it must not wait on the store", took)
	}
	if n := obs.errs.Load(); n < 5 {
		t.Errorf("%d store errors observed, want at least the 5 that opened the breaker", n)
	}
	t.Logf("paused store: breaker open after %v, slowest call %v, %d store errors", openAfter.Round(time.Millisecond), slowest.Round(time.Millisecond), obs.errs.Load())

	if err := r.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Timeout(10 * time.Second))
	for {
		_, err := g.Take(ctx, "after", "s", roomy, 1)
		if err == nil && g.State() == redisstore.Closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered 10s after SIGCONT: breaker %v, last error %v", g.State(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCallerCancellationIsNotAStoreFailure: callers that give up — a
// canceled context, or their own deadline passing while the store is
// paused — get their own error back (errors.Is context.Canceled or
// context.DeadlineExceeded, not ErrStoreUnavailable), and neither the
// breaker nor the store-error count hears of it.
func TestCallerCancellationIsNotAStoreFailure(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := client(t, r.Addr())
	obs := &recorder{}
	s := redisstore.GuardSettings{Timeout: 5 * time.Second, ConsecutiveFailures: 2} // the callers give up first
	g := runningGuard(t, pipelined(t, rdb, "cancel", s.Timeout), s, obs, nil)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 10 {
		_, err := g.Take(canceled, fmt.Sprint("c", i), "s", roomy, 1)
		if !errors.Is(err, context.Canceled) || errors.Is(err, redisstore.ErrStoreUnavailable) {
			t.Fatalf("canceled caller: %v", err)
		}
	}

	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer r.Process().Signal(syscall.SIGCONT)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 { // canceled while waiting on the store
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(20*time.Millisecond, cancel)
				_, err := g.Take(ctx, fmt.Sprint("w", i), "s", roomy, 1)
				if !errors.Is(err, context.Canceled) || errors.Is(err, redisstore.ErrStoreUnavailable) {
					t.Errorf("caller canceled mid-call: %v", err)
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond) // its own deadline
			defer cancel()
			_, err := g.Take(ctx, fmt.Sprint("d", i), "s", roomy, 1)
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redisstore.ErrStoreUnavailable) {
				t.Errorf("caller's own deadline: %v", err)
			}
		}()
	}
	wg.Wait()
	if g.State() != redisstore.Closed || obs.errs.Load() != 0 {
		t.Fatalf("callers that gave up counted against the store: breaker %v, %d store errors", g.State(), obs.errs.Load())
	}
}

// TestDoSharesTheDeadlineAndBreaker: any store call run through Do meets
// the same deadline and counts towards the same breaker as Take.
func TestDoSharesTheDeadlineAndBreaker(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := client(t, r.Addr())
	obs := &recorder{}
	s := redisstore.GuardSettings{Timeout: 5 * time.Millisecond, ConsecutiveFailures: 3, OpenFor: time.Hour}
	g := runningGuard(t, pipelined(t, rdb, "do", s.Timeout), s, obs, nil)
	ctx := context.Background()

	// A call that works, with a deadline on its context.
	err := g.Do(ctx, func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("Do's context has no deadline")
		}
		return rdb.Ping(ctx).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	// A store error is the store's: wrapped, and still the original error.
	boom := errors.New("boom")
	if err := g.Do(ctx, func(context.Context) error { return boom }); !errors.Is(err, redisstore.ErrStoreUnavailable) || !errors.Is(err, boom) {
		t.Fatalf("store error: %v", err)
	}
	// A call that never answers is ended by the guard: redis-server paused.
	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := g.Do(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
		if !errors.Is(err, redisstore.ErrStoreUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("paused store through Do: %v", err)
		}
	}
	_ = r.Process().Signal(syscall.SIGCONT)
	// Three failures through Do opened the breaker for Take too.
	if g.State() != redisstore.Open {
		t.Fatalf("breaker %v after 3 failures through Do", g.State())
	}
	if _, err := g.Take(ctx, "k", "s", roomy, 1); !errors.Is(err, redisstore.ErrStoreUnavailable) {
		t.Fatalf("Take with the breaker open: %v", err)
	}
	called := false
	if err := g.Do(ctx, func(context.Context) error { called = true; return nil }); !errors.Is(err, redisstore.ErrStoreUnavailable) || called {
		t.Fatalf("Do with the breaker open: %v (called %v)", err, called)
	}
	if n := obs.errs.Load(); n != 3 {
		t.Errorf("%d store errors observed, want 3", n)
	}
}

// TestPlainStoreBehindTheGuardFailsFast: a store whose calls heed only
// their deadline (redisstore.Store: a go-redis read) is still given up on
// when the guard judges it late, not when the client's read times out.
func TestPlainStoreBehindTheGuardFailsFast(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := client(t, r.Addr())
	store := redisstore.New(rdb, "plain")
	ctx := context.Background()
	if err := store.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	g := runningGuard(t, store, redisstore.GuardSettings{Timeout: 5 * time.Millisecond}, nil, nil)
	if _, err := g.Take(ctx, "warm", "s", roomy, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer r.Process().Signal(syscall.SIGCONT)
	start := time.Now()
	_, err := g.Take(ctx, "paused", "s", roomy, 1)
	took := time.Since(start)
	if !errors.Is(err, redisstore.ErrStoreUnavailable) {
		t.Fatalf("paused store: %v", err)
	}
	// The guard gives up after 5 ms, or 105 ms of running time on a busy
	// machine; the client would wait for its 1 s deadline (MaxWait).
	if took >= 900*time.Millisecond {
		t.Fatalf("Take on a paused plain store took %v: it waited for the client's read deadline", took)
	}
}

// heeding is an in-process authority that declares redisstore.HeedsCancel, as
// redisstore.Pipelined does, and checks the context of each call: it must
// carry the caller's value (the key of the call), a deadline no later than
// the caller's, and not be done yet. A call whose key starts with "late"
// is answered only when its context is done.
type heeding struct {
	*enforcement.MemoryAuthority
	bad chan string
}

func (h heeding) HeedsCancel() {}

type ctxKey struct{}

func (h heeding) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	report := func(what string) {
		select {
		case h.bad <- key + ": " + what:
		default:
		}
	}
	if v, _ := ctx.Value(ctxKey{}).(string); v != key {
		report(fmt.Sprintf("the context carries %q", v))
	}
	if ctx.Err() != nil {
		report(fmt.Sprintf("the context is done already: %v", ctx.Err()))
	}
	d, ok := ctx.Deadline()
	if !ok {
		report("no deadline")
	}
	if cd, ok := ctx.Value(deadlineKey{}).(time.Time); ok && d.After(cd) {
		report(fmt.Sprintf("deadline %v after the caller's %v", d, cd))
	}
	if strings.HasPrefix(key, "late") {
		<-ctx.Done()
		return enforcement.Verdict{}, ctx.Err()
	}
	return h.MemoryAuthority.Take(ctx, key, scope, lim, cost)
}

type deadlineKey struct{}

// TestCallContextIsEachCallersOwn: the guard reuses the context it hands a
// HeedsCancel store; each call must still see its own caller's
// values, a deadline no later than its caller's, and a context that is not
// done, also right after calls the guard gave up on or their callers left.
func TestCallContextIsEachCallersOwn(t *testing.T) {
	h := heeding{MemoryAuthority: enforcement.NewMemoryAuthority(nil, 1000), bad: make(chan string, 1)}
	g := runningGuard(t, h, redisstore.GuardSettings{Timeout: time.Millisecond, MaxWait: time.Second, ConsecutiveFailures: 1 << 30}, nil, nil)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				key := fmt.Sprint("k", w, "/", i)
				if i%10 == 0 {
					key = "late" + key // given up on by the guard
				}
				ctx := context.WithValue(context.Background(), ctxKey{}, key)
				cancel := context.CancelFunc(func() {})
				switch i % 3 {
				case 1: // a deadline of its own
					ctx, cancel = context.WithTimeout(ctx, time.Minute)
					d, _ := ctx.Deadline()
					ctx = context.WithValue(ctx, deadlineKey{}, d)
				case 2: // a caller that leaves while a late call waits
					if i%10 == 0 {
						ctx, cancel = context.WithCancel(ctx)
						time.AfterFunc(time.Millisecond/2, cancel)
					}
				}
				_, err := g.Take(ctx, key, "s", roomy, 1)
				cancel()
				switch {
				case strings.HasPrefix(key, "late"):
					if err == nil {
						t.Errorf("%s: a call answered only when given up on succeeded", key)
					}
				case err != nil:
					t.Errorf("%s: %v", key, err)
				}
			}
		}()
	}
	wg.Wait()
	select {
	case what := <-h.bad:
		t.Fatal(what)
	default:
	}
}

// runningGuard is NewGuard with its starvation monitor running until the
// test ends, as Shared.Run runs it in the limiter.
func runningGuard(t testing.TB, next enforcement.Authority, s redisstore.GuardSettings, obs redisstore.Observer, log *slog.Logger) *redisstore.Guard {
	g := redisstore.NewGuard(next, s, obs, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return g
}
