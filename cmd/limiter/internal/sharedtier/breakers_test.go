package sharedtier

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// regionTier is the limiter's decision path as built from its variables
// (REDIS_ADDRS, REDIS_STORES with the store "big", LIMITER_REGION a of
// a,b, GLOBAL_REDIS_ADDRS): the tier, its region and its shadow store,
// with the breaker settings and store timeout given. Its group is released
// at cleanup.
func regionTier(t *testing.T, failures int, openFor, timeout time.Duration, def, big, home *testenv.Redis) (*Tier, *Region, enforcement.Authority) {
	t.Helper()
	env := map[string]string{
		"REDIS_ADDRS": def.Addr(), "REDIS_STORES": "big=" + big.Addr(),
		"LIMITER_REGION": "a", "LIMITER_REGIONS": "a,b", "GLOBAL_REDIS_ADDRS": home.Addr(),
	}
	e := envconfig.New(func(k string) string { return env[k] })
	rc := redisclient.FromEnv(e, limits.DefaultKeyPrefix)
	stores := redisclient.StoresFromEnv(e, rc, limits.ValidStoreName)
	regions := RegionsFromEnv(e, rc)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	tier, err := Build(context.Background(), Config{Redis: rc, Stores: stores, StoreTimeout: timeout,
		BreakerFailures: failures, BreakerOpenFor: openFor, MaxKeys: 1000, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	var g lifecycle.Group
	tier.Add(&g)
	t.Cleanup(func() { _ = g.Release(nil, 10*time.Second) })
	region, err := tier.BuildRegion(&g, regions, "member-1", prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	shadow, _, _ := tier.ShadowChain(timeout, log)
	return tier, region, shadow
}

// TestEveryBreakerTakesTheSettings: LIMITER_BREAKER_FAILURES and
// LIMITER_BREAKER_OPEN_FOR reach every breaker the limiter builds (the
// default store's, a named store's, the shadow store's, the global
// decisions'). With the stores killed, each breaker refuses its calls
// (enforcement.ErrBreakerOpen) after exactly the configured failures in a
// row, and, open for ten minutes, is still open once its default open time
// (a second) has passed. A breaker added to the limiter belongs in the
// list below.
func TestEveryBreakerTakesTheSettings(t *testing.T) {
	t.Parallel()
	def, big, home := testenv.StartRedis(t), testenv.StartRedis(t), testenv.StartRedis(t)
	const failures = 7 // not the default 5
	tier, region, shadow := regionTier(t, failures, 10*time.Minute, 50*time.Millisecond, def, big, home)
	lim := enforcement.Limit{Rate: 1, Burst: 10}
	onBig := lim
	onBig.Store = "big"
	breakers := []struct {
		name string
		auth enforcement.Authority
		lim  enforcement.Limit
	}{
		{"default store", tier, lim},
		{"store big", tier, onBig},
		{"shadow store", shadow, lim},
		{"global decisions", region.Authority(), lim},
	}
	def.Close()
	big.Close()
	ctx := context.Background()
	for _, b := range breakers {
		for i := 1; ; i++ {
			_, err := b.auth.Take(ctx, "acct_"+b.name, "api", b.lim, 1)
			if err == nil {
				t.Fatalf("%s: a decision with its store killed", b.name)
			}
			if errors.Is(err, enforcement.ErrBreakerOpen) {
				if i-1 != failures {
					t.Errorf("%s: the breaker opened after %d failures, LIMITER_BREAKER_FAILURES is %d", b.name, i-1, failures)
				}
				break
			}
			if i > failures {
				t.Errorf("%s: still asking the store after %d failures (%v), LIMITER_BREAKER_FAILURES is %d", b.name, i, err, failures)
				break
			}
		}
	}
	// The default open time passes; nothing here depends on how long
	// anything took: a breaker open for ten minutes is open, one that took
	// the default has let a probe through to the dead store.
	time.Sleep(time.Second + 500*time.Millisecond)
	for _, b := range breakers {
		if _, err := b.auth.Take(ctx, "acct_"+b.name, "api", b.lim, 1); !errors.Is(err, enforcement.ErrBreakerOpen) {
			t.Errorf("%s: past the default open time, LIMITER_BREAKER_OPEN_FOR 10m: %v, want the breaker still open", b.name, err)
		}
	}
}

// TestGlobalDecisionDeadline: a global decision's call to the region's
// Redis carries the deadline docs/regions.md states, LIMITER_STORE_TIMEOUT
// + 100 ms (GlobalDeadline), not the bare store timeout. The deadline is
// read from the call's context as the Redis client sends it, and compared
// with the clock read before and after the decision: exact whatever the
// machine's speed.
func TestGlobalDecisionDeadline(t *testing.T) {
	t.Parallel()
	def, big, home := testenv.StartRedis(t), testenv.StartRedis(t), testenv.StartRedis(t)
	const timeout = 5 * time.Millisecond // LIMITER_STORE_TIMEOUT's default
	tier, region, _ := regionTier(t, 5, time.Second, timeout, def, big, home)
	if want := timeout + 100*time.Millisecond; GlobalDeadline(timeout) != want {
		t.Fatalf("GlobalDeadline(%s) = %s, want %s (docs/regions.md)", timeout, GlobalDeadline(timeout), want)
	}
	deadlines := make(chan time.Time, 16)
	tier.rdb.AddHook(deadlineHook{deadlines})
	before := time.Now()
	_, err := region.Authority().Take(context.Background(), "acct_1", "api", enforcement.Limit{Rate: 100, Burst: 100}, 1)
	after := time.Now()
	t.Logf("the global decision: %v (an error is a late Redis, not this test's concern)", err)
	var got []time.Time
	for len(deadlines) > 0 {
		got = append(got, <-deadlines)
	}
	if len(got) == 0 {
		t.Fatal("the global decision sent no script call with a deadline")
	}
	want := GlobalDeadline(timeout)
	for _, d := range got {
		if d.Before(before.Add(want)) || d.After(after.Add(want)) {
			t.Errorf("a global decision's call has %s to its deadline, want %s (LIMITER_STORE_TIMEOUT %s + 100 ms)",
				d.Sub(before).Round(time.Millisecond), want, timeout)
		}
	}
}

// deadlineHook sends the deadline of each script call the client makes.
type deadlineHook struct{ c chan<- time.Time }

func (deadlineHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h deadlineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			if d, ok := ctx.Deadline(); ok {
				select {
				case h.c <- d:
				default:
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (deadlineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
