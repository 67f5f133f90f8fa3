package global_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The tests below step the refillers themselves (Global.Tick, no Run), on
// a limit whose rate is so slow that the global bucket refills less than
// a token over any test's life (0.001/s: a token in 1000 s): the budget
// they find is exact, whatever the machine's speed.

// stepped is a region whose refiller the test steps.
type stepped struct {
	g     *global.Global
	local *redis.Client
}

func newStepped(t *testing.T, home *testenv.Redis, name string, n int) stepped {
	t.Helper()
	r := testenv.StartRedis(t)
	local := client(t, r.Addr())
	g, err := global.New(global.Config{
		Region: name, Regions: n,
		Local: local, Home: client(t, home.Addr()),
		Prefix: "t", HomePrefix: "t", Member: name + "-1",
		Timeout: 2 * time.Second, LocalTimeout: 2 * time.Second, HomeTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return stepped{g: g, local: local}
}

// pool is a region's pool as pool.lua stores it.
type pool struct{ tokens, wanted, spent, esc, ets, qused, owed float64 }

func readPool(t *testing.T, r stepped, key, scope string) pool {
	t.Helper()
	raw, err := r.local.Get(context.Background(), "t:{"+key+"}:gp:"+scope).Bytes()
	if errors.Is(err, redis.Nil) {
		return pool{esc: -1}
	}
	if err != nil || len(raw) != 56 {
		t.Fatalf("pool of %q: %d bytes, %v", key, len(raw), err)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])) }
	return pool{f(0), f(1), f(2), f(3), f(4), f(5), f(6)}
}

// homeTokens is what the key's global bucket holds at the home (as of its
// last update; a bucket never written is full).
func homeTokens(t *testing.T, home *testenv.Redis, key, scope string, lim enforcement.Limit) float64 {
	t.Helper()
	rdb := client(t, home.Addr())
	b, found, err := redisstore.ReadBucket(context.Background(), rdb, redisstore.New(rdb, "t:g").BucketKey(key, scope))
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return float64(lim.Burst)
	}
	return b.Tokens
}

// reserveSoon reserves cost on r, stepping r's refiller between tries
// until the pool covers it (a cold or indebted pool rejects until the
// refiller has leased).
func reserveSoon(t *testing.T, r stepped, key, scope string, lim enforcement.Limit, cost int64, id string) enforcement.Verdict {
	t.Helper()
	ctx := context.Background()
	for try := 0; try < 20; try++ {
		v, err := r.g.Reserve(ctx, key, scope, lim, cost, id, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed {
			return v
		}
		r.g.Tick(ctx)
	}
	t.Fatalf("reservation of %d on %q not allowed after 20 refill ticks", cost, key)
	return enforcement.Verdict{}
}

var slowLimit = enforcement.Limit{Rate: 0.001, Burst: 100_000}

// TestReserveSettleChargeSpendTheGlobalBudget: two regions sharing a
// home reserve estimates, settle different actual costs (refunds and
// excesses into debt), settle twice, settle unknown ids, charge, and
// leave some reservations unsettled, the refillers stepped among them:
// the global budget (the home's bucket and both pools, debts counted
// negative) ends at burst − Σ actual cost, an unsettled reservation's
// actual cost being its estimate, within the refill of the test's life.
func TestReserveSettleChargeSpendTheGlobalBudget(t *testing.T) {
	home := startHome(t)
	regions := []stepped{newStepped(t, home, "a", 2), newStepped(t, home, "b", 2)}
	lim := slowLimit
	const key, scope = "acct", "llm:tokens"
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	start := time.Now()

	type resv struct {
		id       string
		region   int
		estimate int64
	}
	var open []resv
	var actual, debts, refunds int64
	n := 0
	newID := func() string { n++; return fmt.Sprintf("id-%d", n) }
	for op := 0; op < 300; op++ {
		ri := rng.IntN(len(regions))
		r := regions[ri]
		switch k := rng.IntN(10); {
		case k < 4:
			e := 1 + rng.Int64N(50)
			id := newID()
			reserveSoon(t, r, key, scope, lim, e, id)
			if rng.IntN(10) == 0 { // sent again: spends nothing more
				before := readPool(t, r, key, scope).tokens
				if v, err := r.g.Reserve(ctx, key, scope, lim, e, id, time.Minute); err != nil || !v.Allowed {
					t.Fatalf("reservation sent again: %+v, %v", v, err)
				}
				if after := readPool(t, r, key, scope).tokens; after != before {
					t.Fatalf("reservation sent again spent %v", before-after)
				}
			}
			open = append(open, resv{id, ri, e})
		case k < 7 && len(open) > 0:
			i := rng.IntN(len(open))
			res := open[i]
			open = append(open[:i], open[i+1:]...)
			a := rng.Int64N(120)
			s, err := regions[res.region].g.Settle(ctx, key, scope, res.id, lim, a, false, time.Minute)
			if err != nil {
				t.Fatalf("settle %s: %v", res.id, err)
			}
			if s.Estimate != res.estimate || s.Charged != a || s.Refunded != max(0, res.estimate-a) {
				t.Fatalf("settle of %d for %d: %+v", a, res.estimate, s)
			}
			if s.Debt > 0 {
				debts++
			}
			if a < res.estimate {
				refunds++
			}
			actual += a
			if rng.IntN(4) == 0 {
				if _, err := regions[res.region].g.Settle(ctx, key, scope, res.id, lim, 1+a, false, time.Minute); !errors.Is(err, enforcement.ErrAlreadySettled) {
					t.Fatalf("second settle: %v, want already settled", err)
				}
			}
		case k < 8:
			c := rng.Int64N(80)
			if _, err := r.g.Settle(ctx, key, scope, newID(), lim, c, true, time.Minute); err != nil {
				t.Fatalf("charge: %v", err)
			}
			actual += c
		case k < 9:
			if _, err := r.g.Settle(ctx, key, scope, "never-made", lim, 7, false, time.Minute); !errors.Is(err, enforcement.ErrReservationNotFound) {
				t.Fatalf("settle of an unknown id: %v, want not found", err)
			}
		default:
			r.g.Tick(ctx)
		}
	}
	for _, res := range open {
		actual += res.estimate // expires at its estimate: nothing to do
	}
	if debts == 0 || refunds == 0 {
		t.Fatalf("the mix made %d settles into debt and %d refunds: both wanted", debts, refunds)
	}
	budget := homeTokens(t, home, key, scope, lim)
	for _, r := range regions {
		budget += readPool(t, r, key, scope).tokens
	}
	want := float64(lim.Burst - actual)
	tol := lim.Rate*time.Since(start).Seconds() + 1e-6
	t.Logf("Σ actual %d (%d settles into debt, %d refunds); budget %.3f, want %.0f (+ ≤ %.3f refill)", actual, debts, refunds, budget, want, tol)
	if budget < want-1e-6 || budget > want+tol {
		t.Fatalf("global budget %.3f, want burst − Σ actual = %.0f (+ ≤ %.3f refill)", budget, want, tol)
	}
}

// globalLimiter is a limiter of region r whose every key's limit is lim,
// global (globalPolicy: key "g").
func globalLimiter(t *testing.T, r stepped, lim enforcement.Limit) *enforcement.Limiter {
	t.Helper()
	st := redisstore.New(r.local, "t")
	l, err := enforcement.New(enforcement.Config{
		Authority: st, Reservations: st, Global: r.g, Regions: 2,
		Policy: globalPolicy{lim}, ReservationTTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSettleIntoDebtRejectsUntilPaid: through the limiter, a global
// key's reservation settled beyond what the pool holds puts the pool in
// debt: every request is rejected then, cost 0 too, with the time the
// region's share of the global refill takes to pay it; the refiller
// leases the debt from the global bucket, after which a cost-0 check
// passes; a refund puts tokens back in the pool; the regional bucket of
// the key is never touched.
func TestSettleIntoDebtRejectsUntilPaid(t *testing.T) {
	home := startHome(t)
	a := newStepped(t, home, "a", 2)
	lim := slowLimit
	l := globalLimiter(t, a, lim)
	ctx := context.Background()
	check := func(cost int64, reserve bool) enforcement.Decision {
		t.Helper()
		d, err := l.Check(ctx, enforcement.Request{Key: "g", Scope: "api", Cost: cost, HasCost: true, Reserve: reserve})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// A reservation settled at 0 leaves the pool holding 40 for the
	// limiter's.
	reserveSoon(t, a, "g", "api", lim, 40, "warm")
	if _, err := a.g.Settle(ctx, "g", "api", "warm", lim, 0, false, time.Minute); err != nil {
		t.Fatal(err)
	}
	d := check(40, true)
	if !d.Allowed || d.Reservation == "" || d.Source != enforcement.SourceShared {
		t.Fatalf("reservation from the pool: %+v", d)
	}
	before := readPool(t, a, "g", "api").tokens
	s, err := l.Settle(ctx, d.Reservation, 40+int64(before)+25)
	if err != nil {
		t.Fatal(err)
	}
	if s.Debt != 25 || s.Remaining != -25 || s.Estimate != 40 {
		t.Fatalf("settle into debt: %+v (pool held %v)", s, before)
	}
	if _, err := l.Settle(ctx, d.Reservation, 1); !errors.Is(err, enforcement.ErrAlreadySettled) {
		t.Fatalf("second settle: %v", err)
	}
	if s, err := l.Charge(ctx, enforcement.Request{Key: "g", Scope: "api", Cost: 5}); err != nil || s.Debt != 30 {
		t.Fatalf("charge in debt: %+v, %v", s, err)
	}
	share := lim.Rate / 2
	for _, cost := range []int64{0, 1} {
		d := check(cost, false)
		if d.Allowed || d.RetryAfter < time.Duration(30/share*float64(time.Second)) {
			t.Fatalf("cost %d in debt: %+v, want rejected for ≥ 30 tokens at the region's share", cost, d)
		}
	}
	if p := readPool(t, a, "g", "api"); p.tokens != -30 {
		t.Fatalf("pool in debt after rejections: %+v", p)
	}
	paid := false
	for try := 0; try < 20 && !paid; try++ {
		a.g.Tick(ctx)
		paid = check(0, false).Allowed
	}
	if !paid {
		t.Fatal("cost 0 still rejected after 20 refill ticks")
	}
	p := readPool(t, a, "g", "api")
	if got, want := homeTokens(t, home, "g", "api", lim)+p.tokens, float64(lim.Burst-(40+int64(before)+25)-5); math.Abs(got-want) > 1e-3 {
		t.Fatalf("global budget %v after the debt is paid, want %v", got, want)
	}

	// A refund: a reservation settled below its estimate gives the rest
	// back to the pool.
	var id string
	for try := 0; try < 20 && id == ""; try++ {
		if d := check(30, true); d.Allowed {
			id = d.Reservation
		} else {
			a.g.Tick(ctx)
		}
	}
	if id == "" {
		t.Fatal("no reservation after 20 refill ticks")
	}
	before = readPool(t, a, "g", "api").tokens
	if s, err := l.Settle(ctx, id, 12); err != nil || s.Refunded != 18 {
		t.Fatalf("refund: %+v, %v", s, err)
	}
	if after := readPool(t, a, "g", "api").tokens; after != before+18 {
		t.Fatalf("pool %v after a refund of 18 from %v", after, before)
	}
	if n, err := a.local.Keys(ctx, "t:{g}:b2:*").Result(); err != nil || len(n) != 0 {
		t.Fatalf("the regional bucket was written: %v, %v", n, err)
	}
}

// TestSettleOnTheEscrowWhileCut: with the home unreachable, a charge
// spends what the pool holds, then the escrow; a reservation the pool
// cannot cover is made on the escrow and its refund goes back there; an
// excess beyond the escrow leaves it in debt, and a cost-0 request on
// the key is then rejected (on the escrow, regional).
func TestSettleOnTheEscrowWhileCut(t *testing.T) {
	home := startHome(t)
	a := newStepped(t, home, "a", 2)
	lim := slowLimit
	ctx := context.Background()
	reserveSoon(t, a, "e", "api", lim, 20, "warm")
	if _, err := a.g.Settle(ctx, "e", "api", "warm", lim, 0, false, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := home.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer home.Process().Signal(syscall.SIGCONT)
	a.g.Tick(ctx) // finds the home unreachable
	if a.g.Reachable() {
		t.Fatal("home still reachable after a tick with the home frozen")
	}
	held := readPool(t, a, "e", "api").tokens
	if held < 20 {
		t.Fatalf("the pool holds %v, want the 20 refunded", held)
	}
	eburst := float64(lim.Burst / 2)
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.01 {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
	// The pool's tokens, then 10 from the escrow.
	if _, err := a.g.Settle(ctx, "e", "api", "c1", lim, int64(held)+10, true, time.Minute); err != nil {
		t.Fatal(err)
	}
	p := readPool(t, a, "e", "api")
	near("pool", p.tokens, 0)
	near("escrow", p.esc, eburst-10)
	near("owed", p.owed, 10)
	v := reserveSoon(t, a, "e", "api", lim, 30, "r1")
	if !v.Regional {
		t.Fatalf("reservation with the home cut and the pool empty: %+v", v)
	}
	if s, err := a.g.Settle(ctx, "e", "api", "r1", lim, 5, false, time.Minute); err != nil || s.Refunded != 25 {
		t.Fatalf("refund on the escrow: %+v, %v", s, err)
	}
	p = readPool(t, a, "e", "api")
	near("escrow after the refund", p.esc, eburst-15)
	near("owed after the refund", p.owed, 15)
	s, err := a.g.Settle(ctx, "e", "api", "c2", lim, int64(eburst), true, time.Minute)
	if err != nil || s.Debt != 15 {
		t.Fatalf("charge beyond the escrow: %+v, %v", s, err)
	}
	v, err = a.g.Take(ctx, "e", "api", lim, 0)
	if err != nil || v.Allowed || !v.Regional || v.RetryAfter < time.Duration(15/(lim.Rate/2)*float64(time.Second)) {
		t.Fatalf("cost 0 with the escrow in debt: %+v, %v", v, err)
	}
}

// downSettles is a region's Global whose settles fail while down, as when
// the region's Redis cannot be reached, without reaching it.
type downSettles struct {
	*global.Global
	down atomic.Bool
}

func (d *downSettles) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	if d.down.Load() {
		return enforcement.Settlement{}, errors.New("the region's Redis is down")
	}
	return d.Global.Settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
}

// TestQueuedSettleOfAGlobalKeyReachesThePool: a settle of a global key's
// reservation that could not reach the region's Redis is queued, and once
// the store answers it is applied to the pool the reservation spent, not
// to the regional store, where no such reservation is.
func TestQueuedSettleOfAGlobalKeyReachesThePool(t *testing.T) {
	home := startHome(t)
	a := newStepped(t, home, "a", 2)
	g := &downSettles{Global: a.g}
	st := redisstore.New(a.local, "t")
	lim := slowLimit
	l, err := enforcement.New(enforcement.Config{
		Authority: st, Reservations: st, Global: g, Regions: 2,
		Policy: globalPolicy{lim}, ReservationTTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reserveSoon(t, a, "g", "api", lim, 40, "warm")
	if _, err := a.g.Settle(ctx, "g", "api", "warm", lim, 0, false, time.Minute); err != nil {
		t.Fatal(err)
	}
	d, err := l.Check(ctx, enforcement.Request{Key: "g", Scope: "api", Cost: 30, HasCost: true, Reserve: true})
	if err != nil || !d.Allowed || d.Reservation == "" {
		t.Fatalf("reservation from the pool: %+v, %v", d, err)
	}
	before := readPool(t, a, "g", "api").tokens
	g.down.Store(true)
	if s, err := l.Settle(ctx, d.Reservation, 10); err != nil || !s.Queued {
		t.Fatalf("settle with the store down: %+v, %v, want queued", s, err)
	}
	g.down.Store(false)
	if left := l.DrainSettles(ctx); left != 0 {
		t.Fatalf("%d settles still queued with the store back", left)
	}
	if after := readPool(t, a, "g", "api").tokens; after != before+20 {
		t.Fatalf("pool %v after the queued settle's refund of 20, from %v", after, before)
	}
	if _, err := l.Settle(ctx, d.Reservation, 10); !errors.Is(err, enforcement.ErrAlreadySettled) {
		t.Fatalf("settle again after the queue applied it: %v, want already settled", err)
	}
}
