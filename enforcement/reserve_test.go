package enforcement_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// reserveLimiter is a limiter on a MemoryAuthority that keeps reservations,
// on a controlled clock.
func reserveLimiter(t *testing.T, clk *clock, rate float64, burst int64, ttl time.Duration) (*enforcement.Limiter, *enforcement.MemoryAuthority) {
	t.Helper()
	mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
	return newLimiter(t, enforcement.Config{Authority: mem, Reservations: mem, Policy: policyOf(rate, burst),
		Now: clk.Now, ReservationTTL: ttl, LocalHeadroom: 1000}), mem
}

func reserveReq(key string, estimate int64) enforcement.Request {
	r := req(key, estimate)
	r.Reserve = true
	return r
}

func TestReserveSettleChargeRules(t *testing.T) {
	clk := newClock()
	l, _ := reserveLimiter(t, clk, 1, 100, time.Minute)
	ctx := context.Background()

	d, err := l.Check(ctx, reserveReq("k", 30))
	if err != nil || !d.Allowed || d.Reservation == "" || d.Remaining != 70 {
		t.Fatalf("reserve 30: %+v, %v", d, err)
	}
	s, err := l.Settle(ctx, d.Reservation, 50) // 20 more than reserved
	if err != nil || s.Charged != 50 || s.Refunded != 0 || s.Remaining != 50 || s.Debt != 0 || s.Estimate != 30 || s.Kind != "settle" {
		t.Fatalf("settle 50 of 30: %+v, %v", s, err)
	}
	if _, err := l.Settle(ctx, d.Reservation, 50); !errors.Is(err, enforcement.ErrAlreadySettled) {
		t.Fatalf("second settle: %v", err)
	}
	d, _ = l.Check(ctx, reserveReq("k", 40))
	if s, err = l.Settle(ctx, d.Reservation, 10); err != nil || s.Refunded != 30 || s.Remaining != 40 {
		t.Fatalf("settle 10 of 40: %+v, %v", s, err)
	}
	// A charge beyond what is there takes the bucket into debt.
	if s, err = l.Charge(ctx, req("k", 190)); err != nil || s.Remaining != -150 || s.Debt != 150 || s.Kind != "charge" {
		t.Fatalf("charge 190 of 40: %+v, %v", s, err)
	}
	// In debt every request is rejected, cost 0 too, and the retry time
	// pays the debt off and then affords the cost (rate 1/s).
	if d, _ = l.Check(ctx, req("k", 0)); d.Allowed || d.RetryAfter != 150*time.Second {
		t.Fatalf("cost 0 in debt: %+v", d)
	}
	if d, _ = l.Check(ctx, req("k", 5)); d.Allowed || d.RetryAfter != 155*time.Second {
		t.Fatalf("cost 5 in debt: %+v", d)
	}
	if d, _ = l.Check(ctx, reserveReq("k", 5)); d.Allowed || d.Reservation != "" {
		t.Fatalf("reserve in debt: %+v", d)
	}
	clk.Add(155 * time.Second)
	if d, _ = l.Check(ctx, req("k", 5)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the advertised retry: %+v", d)
	}
}

func TestSettleUnknownAlteredAndExpired(t *testing.T) {
	clk := newClock()
	l, mem := reserveLimiter(t, clk, 1, 100, time.Minute)
	ctx := context.Background()
	d, _ := l.Check(ctx, reserveReq("k", 10))
	for _, id := range []string{"", "nope", "AAAA", alterID(d.Reservation), d.Reservation + "A"} {
		if id == d.Reservation {
			continue
		}
		if _, err := l.Settle(ctx, id, 1); !errors.Is(err, enforcement.ErrReservationNotFound) {
			t.Errorf("settle %q: %v", id, err)
		}
	}
	if _, err := l.Settle(ctx, d.Reservation, -1); !errors.Is(err, enforcement.ErrInvalidRequest) {
		t.Errorf("negative cost: %v", err)
	}
	// Past the TTL the reservation is settled at its estimate: nothing
	// to settle, and the bucket keeps the estimate spent.
	clk.Add(time.Minute)
	if _, err := l.Settle(ctx, d.Reservation, 90); !errors.Is(err, enforcement.ErrReservationNotFound) {
		t.Fatalf("expired: %v", err)
	}
	if s, _ := l.Charge(ctx, req("k", 0)); s.Remaining != 100 {
		t.Fatalf("after expiry (90 spent, 60 refilled, capped): %+v", s)
	}
	mem.Sweep(clk.Now())
	if n := mem.Reservations(); n != 1 { // the charge's own marker
		t.Fatalf("records after the sweep: %d", n)
	}
	clk.Add(time.Minute)
	mem.Sweep(clk.Now())
	if n := mem.Reservations(); n != 0 {
		t.Fatalf("records after the TTL: %d", n)
	}
}

// TestReserveSettleChargeExpiryExact: after any mix of reserve, settle
// (some twice), charge and expiry on one key, the bucket holds exactly
// burst + refill − Σ actual costs (an expired reservation's actual cost is
// its estimate). The clock moves in whole ms at 1000 tokens/s, so every
// value is an integer, and the costs keep the bucket below its capacity,
// where nothing is capped.
func TestReserveSettleChargeExpiryExact(t *testing.T) {
	for seed := range uint64(20) {
		clk := newClock()
		const burst, ttl = 10_000, 20 * time.Millisecond
		l, _ := reserveLimiter(t, clk, 1000, burst, ttl)
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 7))
		type open struct {
			id       string
			estimate int64
			expires  time.Time
			settled  bool
		}
		var opens []*open
		var spent int64
		first := clk.Now()
		if s, err := l.Charge(ctx, req("k", 5000)); err != nil || s.Remaining != 5000 {
			t.Fatalf("first charge: %+v %v", s, err)
		}
		spent += 5000
		for range 2000 {
			switch op := rng.IntN(10); {
			case op < 4:
				est := 1 + rng.Int64N(20)
				d, err := l.Check(ctx, reserveReq("k", est))
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != (d.Reservation != "") {
					t.Fatalf("allowed %v with reservation %q", d.Allowed, d.Reservation)
				}
				if d.Allowed {
					spent += est
					opens = append(opens, &open{id: d.Reservation, estimate: est, expires: clk.Now().Add(ttl)})
				}
			case op < 7 && len(opens) > 0:
				o := opens[rng.IntN(len(opens))]
				actual := rng.Int64N(40)
				_, err := l.Settle(ctx, o.id, actual)
				switch {
				case o.settled:
					if !errors.Is(err, enforcement.ErrAlreadySettled) && !errors.Is(err, enforcement.ErrReservationNotFound) {
						t.Fatalf("settled again: %v", err)
					}
				case !clk.Now().Before(o.expires):
					if !errors.Is(err, enforcement.ErrReservationNotFound) {
						t.Fatalf("expired settle: %v", err)
					}
				case err != nil:
					t.Fatalf("settle: %v", err)
				default:
					o.settled = true
					spent += actual - o.estimate
				}
			case op < 8:
				c := rng.Int64N(30)
				if _, err := l.Charge(ctx, req("k", c)); err != nil {
					t.Fatal(err)
				}
				spent += c
			default:
				clk.Add(time.Duration(rng.IntN(4)) * time.Millisecond)
			}
		}
		var nset int
		for _, o := range opens {
			if o.settled {
				nset++
			}
		}
		if nset == 0 || nset == len(opens) {
			t.Fatalf("seed %d: %d of %d reservations settled: the mix lacks settles or expiries", seed, nset, len(opens))
		}
		refill := clk.Now().Sub(first).Milliseconds() // 1 token per ms
		s, err := l.Charge(ctx, req("k", 0))
		if err != nil {
			t.Fatal(err)
		}
		if want := burst + refill - spent; s.Remaining != want || s.Debt != max(0, -want) {
			t.Fatalf("seed %d: bucket %d (debt %d), want burst %d + refill %d − spent %d = %d", seed, s.Remaining, s.Debt, burst, refill, spent, want)
		}
	}
}

// flakyReserver fails while down; with landed, a failing call is applied
// first, as a write that timed out may still land.
type flakyReserver struct {
	enforcement.Reserver
	down, landed atomic.Bool
	calls        atomic.Int64
}

func (f *flakyReserver) Reserve(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	if f.down.Load() {
		return enforcement.Verdict{}, errStoreDown
	}
	return f.Reserver.Reserve(ctx, key, scope, lim, cost, id, ttl)
}

func (f *flakyReserver) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	f.calls.Add(1)
	if f.down.Load() {
		if f.landed.Load() {
			f.Reserver.Settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
		}
		return enforcement.Settlement{}, errStoreDown
	}
	return f.Reserver.Settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
}

func TestSettleThatCannotReachTheStoreIsQueuedAndAppliedOnce(t *testing.T) {
	for _, landed := range []bool{false, true} {
		clk := newClock()
		mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
		fr := &flakyReserver{Reserver: mem}
		fr.landed.Store(landed)
		l := newLimiter(t, enforcement.Config{Authority: mem, Reservations: fr, Policy: policyOf(1, 100), Now: clk.Now, SettleQueue: 3})
		ctx := context.Background()
		d, _ := l.Check(ctx, reserveReq("k", 10))
		fr.down.Store(true)
		s, err := l.Settle(ctx, d.Reservation, 30)
		if err != nil || !s.Queued {
			t.Fatalf("settle while down: %+v, %v", s, err)
		}
		// The caller retries: still one settle queued.
		if s, err = l.Settle(ctx, d.Reservation, 30); err != nil || !s.Queued || l.PendingSettles() != 1 {
			t.Fatalf("retried settle while down: %+v, %v, %d queued", s, err, l.PendingSettles())
		}
		if s, err = l.Charge(ctx, req("k", 5)); err != nil || !s.Queued {
			t.Fatalf("charge while down: %+v, %v", s, err)
		}
		if left := l.DrainSettles(ctx); left != 2 {
			t.Fatalf("drained while down: %d left", left)
		}
		fr.down.Store(false)
		if left := l.DrainSettles(ctx); left != 0 {
			t.Fatalf("drained: %d left", left)
		}
		// 10 reserved, settled at 30, then 5 charged: 100 − 35, however
		// many tries landed.
		if s, _ = l.Charge(ctx, req("k", 0)); s.Remaining != 65 {
			t.Fatalf("landed=%v: remaining %d, want 65", landed, s.Remaining)
		}
		if _, err = l.Settle(ctx, d.Reservation, 30); !errors.Is(err, enforcement.ErrAlreadySettled) {
			t.Fatalf("settle after the queue applied it: %v", err)
		}
	}
}

func TestSettleQueueIsBounded(t *testing.T) {
	clk := newClock()
	mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
	fr := &flakyReserver{Reserver: mem}
	l := newLimiter(t, enforcement.Config{Authority: mem, Reservations: fr, Policy: policyOf(1, 100), Now: clk.Now, SettleQueue: 2})
	fr.down.Store(true)
	ctx := context.Background()
	for i := range 3 {
		_, err := l.Charge(ctx, req("k", 1))
		if full := errors.Is(err, enforcement.ErrSettleQueueFull); full != (i == 2) {
			t.Fatalf("charge %d: %v", i, err)
		}
	}
}

func TestDegradedReservationChargesTheActualCostOnce(t *testing.T) {
	clk := newClock()
	mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
	fr := &flakyReserver{Reserver: mem}
	l := newLimiter(t, enforcement.Config{Authority: mem, Reservations: fr, Policy: policyOf(1, 100), Now: clk.Now})
	ctx := context.Background()
	fr.down.Store(true)
	d, _ := l.Check(ctx, reserveReq("k", 10))
	if !d.Allowed || d.Source != enforcement.SourceDegraded || d.Reservation == "" {
		t.Fatalf("degraded reserve: %+v", d)
	}
	fr.down.Store(false)
	// The store never spent the estimate: the settle charges all 25.
	if s, err := l.Settle(ctx, d.Reservation, 25); err != nil || s.Remaining != 75 || s.Estimate != 10 || s.Refunded != 0 {
		t.Fatalf("settle of a degraded reservation: %+v, %v", s, err)
	}
	if _, err := l.Settle(ctx, d.Reservation, 25); !errors.Is(err, enforcement.ErrAlreadySettled) {
		t.Fatalf("second settle: %v", err)
	}
}

// alterID changes one character of id's random part (a forged id).
func alterID(id string) string {
	b := []byte(id)
	if b[4] == 'A' {
		b[4] = 'B'
	} else {
		b[4] = 'A'
	}
	return string(b)
}

// TestSettleAcrossAQuotaWindowCountsInTheReservationsWindow: a reservation
// made on the last second of a month and settled in the next month
// belongs to the month it was made in (as the rollups count it): the new
// month's quota is charged nothing for it, while a charge, which has no
// reservation, counts in the month it arrives.
func TestSettleAcrossAQuotaWindowCountsInTheReservationsWindow(t *testing.T) {
	for _, period := range []enforcement.Period{enforcement.PeriodMonth, enforcement.PeriodDay} {
		clk := &clock{t: time.Date(2026, 7, 31, 23, 59, 59, 0, time.UTC)}
		mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
		pol := fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 1000, Burst: 1000,
			QuotaLimit: 10000, QuotaPeriod: period, QuotaID: "tier:t"}, Policy: "p", Tier: "t", Cost: 1}}
		l := newLimiter(t, enforcement.Config{Authority: mem, Reservations: mem, Policy: pol, Now: clk.Now,
			ReservationTTL: time.Hour, LocalHeadroom: 1000})
		ctx := context.Background()
		d, err := l.Check(ctx, reserveReq("k", 300))
		if err != nil || !d.Allowed || d.Quota.Remaining != 10000-300 {
			t.Fatalf("%s: reserve 300: %+v, %v", period, d, err)
		}
		clk.Add(2 * time.Second) // the next window
		s, err := l.Settle(ctx, d.Reservation, 742)
		if err != nil || s.QuotaUsed != 0 {
			t.Fatalf("%s: settle 742 of 300 in the next window: quota used %d (want 0: the reservation's window takes it), %v", period, s.QuotaUsed, err)
		}
		if s, err = l.Charge(ctx, req("k", 5)); err != nil || s.QuotaUsed != 5 {
			t.Fatalf("%s: a charge in the new window: quota used %d, want 5 (%v)", period, s.QuotaUsed, err)
		}
		// Within one window the difference applies there.
		d, _ = l.Check(ctx, reserveReq("k", 100))
		if s, err = l.Settle(ctx, d.Reservation, 40); err != nil || s.QuotaUsed != 45 {
			t.Fatalf("%s: settle 40 of 100 in its own window: quota used %d, want 45 (%v)", period, s.QuotaUsed, err)
		}
	}
}

// TestARefundReachesTheLocalTier: a reservation passes the instance's local
// bucket, which spends its estimate as the store does. A settle that gives
// tokens back gives them back there too; otherwise the local tier rejects
// what the store holds, for as long as its own refill takes (hours on a
// slow limit).
func TestARefundReachesTheLocalTier(t *testing.T) {
	clk := newClock()
	mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
	l := newLimiter(t, enforcement.Config{Authority: mem, Reservations: mem, Policy: policyOf(0.001, 1000),
		Now: clk.Now, ReservationTTL: time.Minute, LocalHeadroom: 1})
	ctx := context.Background()
	d, err := l.Check(ctx, reserveReq("k", 800))
	if err != nil || !d.Allowed || d.Remaining != 200 {
		t.Fatalf("reserve 800: %+v, %v", d, err)
	}
	s, err := l.Settle(ctx, d.Reservation, 100)
	if err != nil || s.Refunded != 700 || s.Remaining != 900 {
		t.Fatalf("settle 100 of 800: %+v, %v", s, err)
	}
	d, err = l.Check(ctx, req("k", 500))
	if err != nil || !d.Allowed || d.Remaining != 400 || d.Source != enforcement.SourceShared {
		t.Fatalf("check 500 with 900 in the store: %+v, %v", d, err)
	}
}
