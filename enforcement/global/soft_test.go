package global_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The soft-limit tests step the refillers by hand (Tick, no Run) and use
// a rate of one token an hour, so that what the global bucket refills
// while a test runs, however slow the machine, is a fraction of a token:
// the thresholds sit half a step (5 tokens) from every value a decision
// judges.
const softCost = 10

// softRegion is a region whose refiller the test steps; a pool nobody
// asks of for 60 holds goes back.
func softRegion(t *testing.T, home *testenv.Redis, name string, regions int, hold time.Duration) *global.Global {
	t.Helper()
	r := testenv.StartRedis(t)
	g, err := global.New(global.Config{
		Region: name, Regions: regions,
		Local: client(t, r.Addr()), Home: client(t, home.Addr()),
		Prefix: "t", HomePrefix: "t", Member: name + "-1",
		Timeout: time.Second, HomeTimeout: time.Second, Hold: hold,
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGlobalSoftLimitCountsEveryRegion: a global key's decisions warn
// once every region's use together reaches the soft limit, and not
// before, for the bucket and for the quota: region b spends 30 %, region
// a (through a limiter) spends on to 40 and 50 % without a warning and
// warns at 60 and 70 %; region b, below the threshold on its own, warns
// once its refiller has heard the home's count.
func TestGlobalSoftLimitCountsEveryRegion(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  enforcement.Limit
	}{
		{"bucket", enforcement.Limit{Rate: 1.0 / 3600, Burst: 100, SoftLimitPercent: 55}},
		{"quota", enforcement.Limit{Rate: 1.0 / 3600, Burst: 10000, SoftLimitPercent: 55,
			QuotaLimit: 100, QuotaPeriod: limits.PeriodMonth, QuotaID: "tier:soft"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := startHome(t)
			// A pool is never idle long enough to be returned, however
			// slow the machine between two steps.
			a, b := softRegion(t, home, "a", 2, time.Minute), softRegion(t, home, "b", 2, time.Minute)
			lim := c.lim
			ctx := context.Background()
			l, err := enforcement.New(enforcement.Config{
				Authority: redisstore.New(client(t, home.Addr()), "t"),
				Global:    a, Regions: 2,
				Policy: globalPolicy{lim},
			})
			if err != nil {
				t.Fatal(err)
			}
			// spend makes one decision of softCost allowed in region g and
			// returns whether it warned, failing t if a rejection before it
			// warned while want is false. Rejections come while the pool is
			// empty: they step the refiller, which leases once it has
			// measured demand. With lim set, the allowed decision goes
			// through the limiter, asked only when the pool covers it (a
			// rejection there would be remembered for the hour the cost
			// takes to refill).
			spend := func(g *global.Global, l *enforcement.Limiter, want bool) bool {
				t.Helper()
				for range 10 {
					g.Tick(ctx)
					if l != nil && g.Status().PoolTokens >= softCost {
						d, err := l.Check(ctx, enforcement.Request{Key: "g", Scope: "api", Cost: softCost, HasCost: true})
						if err != nil || !d.Allowed || d.Source != enforcement.SourceShared {
							t.Fatalf("limiter decision from the pool: %+v %v", d, err)
						}
						return d.Warning
					}
					v, err := g.Take(ctx, "g", "api", lim, softCost)
					if err != nil {
						t.Fatal(err)
					}
					if v.Allowed {
						return v.Warning
					}
					if v.Warning && !want {
						t.Errorf("a rejection warned before the soft limit: %+v", v)
					}
				}
				t.Fatal("no decision allowed within 10 refill steps")
				return false
			}
			for i, used := range []int{10, 20, 30} {
				if spend(b, nil, false) {
					t.Fatalf("region b, decision %d: warned at %d %% used", i, used)
				}
			}
			for _, s := range []struct {
				used int
				want bool
			}{{40, false}, {50, false}, {60, true}, {70, true}} {
				if got := spend(a, l, s.want); got != s.want {
					t.Fatalf("region a (limiter), every region's use at %d %%: warning %v, want %v", s.used, got, s.want)
				}
			}
			// Region b has spent 30 % on its own; every region, 80 %.
			if !spend(b, nil, true) {
				t.Fatal("region b at 80 % of every region's use: no warning")
			}
		})
	}
}

// TestGlobalSoftLimitOnTheEscrow: with the home unreachable, decisions on
// the escrow warn once the region's share of the burst (burst ÷ N) is
// used to the soft limit's percentage, and not before.
func TestGlobalSoftLimitOnTheEscrow(t *testing.T) {
	// A home nobody answers at: the refiller's probe fails at once.
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	r := testenv.StartRedis(t)
	g, err := global.New(global.Config{Region: "b", Regions: 2, Local: client(t, r.Addr()), Home: client(t, dead),
		Prefix: "t", Member: "b-1", Timeout: time.Second, HomeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lim := enforcement.Limit{Rate: 1.0 / 3600, Burst: 100, SoftLimitPercent: 55} // escrow: burst 50
	ctx := context.Background()
	if _, err := g.Take(ctx, "e", "api", lim, softCost); err != nil {
		t.Fatal(err)
	}
	g.Tick(ctx)
	if g.Reachable() {
		t.Fatal("the home answered at a closed port")
	}
	for _, s := range []struct {
		used int // % of the escrow's burst after the decision
		want bool
	}{{20, false}, {40, false}, {60, true}, {80, true}} {
		v, err := g.Take(ctx, "e", "api", lim, softCost)
		if err != nil || !v.Allowed || !v.Regional {
			t.Fatalf("a decision on the escrow: %+v %v", v, err)
		}
		if v.Warning != s.want {
			t.Fatalf("escrow %d %% used: warning %v, want %v (%+v)", s.used, v.Warning, s.want, v)
		}
	}
}

// TestReservationsAndSettlesJudgeTheGlobalSoftLimit: a reservation on a
// global key warns as a decision does, by every region's use; a settle
// judges the quota (every region's use as the home counts it) and never
// takes the pool's few tokens for what is left of the bucket.
func TestReservationsAndSettlesJudgeTheGlobalSoftLimit(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  enforcement.Limit
		// settleWarns: the settle after the last reservation warns.
		settleWarns bool
	}{
		{"bucket", enforcement.Limit{Rate: 1.0 / 3600, Burst: 100, SoftLimitPercent: 55}, false},
		{"quota", enforcement.Limit{Rate: 1.0 / 3600, Burst: 10000, SoftLimitPercent: 55,
			QuotaLimit: 100, QuotaPeriod: limits.PeriodMonth, QuotaID: "tier:soft"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := startHome(t)
			a := softRegion(t, home, "a", 2, time.Minute)
			ctx := context.Background()
			reserve := func(id string) enforcement.Verdict {
				t.Helper()
				for range 10 {
					a.Tick(ctx)
					v, err := a.Reserve(ctx, "g", "api", c.lim, softCost, id, time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					if v.Allowed {
						return v
					}
				}
				t.Fatal("no reservation allowed within 10 refill steps")
				return enforcement.Verdict{}
			}
			if v := reserve("r0"); v.Warning {
				t.Fatalf("reservation at 10 %% used warned: %+v", v)
			}
			// A settle at 10 % used: the pool holds a few tokens of the
			// burst, far below the soft limit's share of it.
			s, err := a.Settle(ctx, "g", "api", "r0", c.lim, softCost, false, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if s.Warning {
				t.Fatalf("settle at 10 %% used warned (pool %d of burst %d)", s.Remaining, c.lim.Burst)
			}
			for i, want := range []bool{false, false, false, false, true, true} { // 20 … 70 %
				if v := reserve(fmt.Sprintf("r%d", i+1)); v.Warning != want {
					t.Fatalf("reservation at %d %% used: warning %v, want %v", 20+10*i, v.Warning, want)
				}
			}
			s, err = a.Settle(ctx, "g", "api", "r6", c.lim, softCost, false, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if s.Warning != c.settleWarns {
				t.Fatalf("settle at 70 %% used: warning %v, want %v", s.Warning, c.settleWarns)
			}
		})
	}
}
