package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func reserveOn(t *testing.T, store enforcement.Reserver, auth enforcement.Authority, lim enforcement.Limit, ttl time.Duration) *enforcement.Limiter {
	t.Helper()
	l, err := enforcement.New(enforcement.Config{Authority: auth, Reservations: store, Policy: fixedPolicy{lim}, ReservationTTL: ttl, LocalHeadroom: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func reserveReq(key string, estimate int64) enforcement.Request {
	return enforcement.Request{Key: key, Scope: "tokens", Cost: estimate, HasCost: true, Reserve: true}
}

func chargeReq(key string, cost int64) enforcement.Request {
	return enforcement.Request{Key: key, Scope: "tokens", Cost: cost, HasCost: true}
}

// reserveRules checks the reserve/settle/charge answers on one limiter
// over a Redis store; rate 1e-6/s: nothing refills during the test.
func reserveRules(t *testing.T, l *enforcement.Limiter, key string) {
	ctx := context.Background()
	d, err := l.Check(ctx, reserveReq(key, 30))
	if err != nil || !d.Allowed || d.Reservation == "" || d.Remaining != 70 || d.Source != enforcement.SourceShared {
		t.Fatalf("reserve 30: %+v, %v", d, err)
	}
	s, err := l.Settle(ctx, d.Reservation, 50)
	if err != nil || s.Estimate != 30 || s.Charged != 50 || s.Remaining != 50 || s.Debt != 0 {
		t.Fatalf("settle 50 of 30: %+v, %v", s, err)
	}
	if _, err := l.Settle(ctx, d.Reservation, 50); !errors.Is(err, enforcement.ErrAlreadySettled) {
		t.Fatalf("second settle: %v", err)
	}
	if _, err := l.Settle(ctx, alter(d.Reservation), 1); !errors.Is(err, enforcement.ErrReservationNotFound) {
		t.Fatalf("altered id: %v", err)
	}
	d, _ = l.Check(ctx, reserveReq(key, 40))
	if s, err = l.Settle(ctx, d.Reservation, 10); err != nil || s.Refunded != 30 || s.Remaining != 40 {
		t.Fatalf("settle 10 of 40: %+v, %v", s, err)
	}
	if s, err = l.Charge(ctx, chargeReq(key, 190)); err != nil || s.Remaining != -150 || s.Debt != 150 || s.Queued {
		t.Fatalf("charge into debt: %+v, %v", s, err)
	}
	// In debt, the decision script rejects every cost, 0 too, and its
	// retry time pays the debt off first.
	if d, _ = l.Check(ctx, chargeReq(key, 0)); d.Allowed || d.RetryAfter < 149*time.Second*1e6 {
		t.Fatalf("cost 0 in debt: %+v", d)
	}
	if d, _ = l.Check(ctx, reserveReq(key, 5)); d.Allowed || d.Reservation != "" {
		t.Fatalf("reserve in debt: %+v", d)
	}
}

func TestReserveSettleChargeOnRedis(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	store := redisstore.New(c, "res")
	lim := enforcement.Limit{Rate: 1e-6, Burst: 100}
	reserveRules(t, reserveOn(t, store, store, lim, time.Minute), "acct_1")
	// The same rules through the shared store, whose reservations and
	// settles ride the pipeline's batches beside the decisions.
	shared := redisstore.NewShared(newClient(t, r.Addr()), redisstore.SharedConfig{Prefix: "res"})
	runShared(t, shared)
	reserveRules(t, reserveOn(t, shared, shared, lim, time.Minute), "acct_p")

	ctx := context.Background()
	t.Run("expired", func(t *testing.T) {
		l := reserveOn(t, store, store, lim, time.Millisecond)
		d, _ := l.Check(ctx, reserveReq("acct_2", 10))
		id := d.Reservation
		for { // Redis ends the record on its own clock; wait for it, however long that takes
			n, err := c.Exists(ctx, store.ReservationKey("acct_2", id)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if _, err := l.Settle(ctx, id, 1); !errors.Is(err, enforcement.ErrReservationNotFound) {
			t.Fatalf("expired: %v", err)
		}
		if s, _ := l.Charge(ctx, chargeReq("acct_2", 0)); s.Remaining != 90 {
			t.Fatalf("the estimate stands: %+v", s)
		}
	})
	t.Run("a reserve sent twice spends once", func(t *testing.T) {
		for _, st := range []enforcement.Reserver{store, shared} {
			for range 2 {
				v, err := st.Reserve(ctx, "acct_3", "tokens", lim, 25, "same-id", time.Minute)
				if err != nil || !v.Allowed || v.Remaining != 75 {
					t.Fatalf("%T reserve: %+v, %v", st, v, err)
				}
			}
		}
	})
	t.Run("a refused reserve leaves no record", func(t *testing.T) {
		for i, st := range []enforcement.Reserver{store, shared} {
			key := fmt.Sprintf("acct_refused%d", i)
			v, err := st.Reserve(ctx, key, "tokens", lim, 101, "refused-id", time.Minute)
			if err != nil || v.Allowed {
				t.Fatalf("%T reserve 101 of 100: %+v, %v", st, v, err)
			}
			if n, _ := c.Exists(ctx, store.ReservationKey(key, "refused-id")).Result(); n != 0 {
				t.Fatalf("%T: a refused reservation left its record", st)
			}
			// Not taken for a resend: the same id spends when there is room.
			if v, err = st.Reserve(ctx, key, "tokens", lim, 60, "refused-id", time.Minute); err != nil || !v.Allowed || v.Remaining != 40 {
				t.Fatalf("%T reserve 60 after the refusal: %+v, %v", st, v, err)
			}
		}
	})
	t.Run("quota counts the actual cost", func(t *testing.T) {
		ql := lim
		ql.QuotaLimit, ql.QuotaPeriod, ql.QuotaID = 1000, enforcement.PeriodDay, "q"
		l := reserveOn(t, store, store, ql, time.Minute)
		d, _ := l.Check(ctx, reserveReq("acct_4", 40))
		s, err := l.Settle(ctx, d.Reservation, 7)
		if err != nil || s.QuotaUsed != 7 {
			t.Fatalf("quota after settling 7 of 40: %+v, %v", s, err)
		}
		if s, _ = l.Charge(ctx, chargeReq("acct_4", 3)); s.QuotaUsed != 10 {
			t.Fatalf("quota after a charge of 3: %+v", s)
		}
	})
	t.Run("a settle in a later quota window counts in the reservation's", func(t *testing.T) {
		ql := lim
		ql.QuotaLimit, ql.QuotaPeriod, ql.QuotaID = 100000, enforcement.PeriodMonth, "q"
		start, _ := ql.QuotaPeriod.Window(time.Now())
		prevStart, _ := ql.QuotaPeriod.Window(start.Add(-time.Hour))
		for i, st := range []interface {
			enforcement.Reserver
			ReservationKey(key, id string) string
		}{store, shared.Store()} {
			key, id := fmt.Sprintf("acct_q%d", i), "made-last-month"
			var r enforcement.Reserver = st
			if i == 1 {
				r = shared // the pipelined path, same key layout
			}
			prev, cur := store.QuotaKey(key, "q", prevStart), store.QuotaKey(key, "q", start)
			// The record reserve.lua would have written last month: the
			// estimate 300, counted in last month's counter.
			rec := append([]byte{'r'}, binary.LittleEndian.AppendUint64(nil, math.Float64bits(300))...)
			rec = append(rec, prev...)
			if err := c.Set(ctx, st.ReservationKey(key, id), rec, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.Set(ctx, prev, 300, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			s, err := r.Settle(ctx, key, "tokens", id, ql, 742, false, time.Minute)
			if err != nil || s.QuotaUsed != 0 {
				t.Fatalf("%T: settle 742 of 300 made last month: %+v, %v (want this month's quota untouched)", r, s, err)
			}
			if n, _ := c.Get(ctx, prev).Int64(); n != 742 {
				t.Fatalf("%T: last month's counter %d, want 742", r, n)
			}
			if n, err := c.Exists(ctx, cur).Result(); err != nil || n != 0 {
				t.Fatalf("%T: this month's counter exists (%d, %v)", r, n, err)
			}
		}
	})
	t.Run("overshoot within the underestimates in flight", func(t *testing.T) { overshoot(t, r.Addr()) })
	t.Run("forged values in the record slot", func(t *testing.T) {
		l := reserveOn(t, store, store, lim, time.Minute)
		d, _ := l.Check(ctx, reserveReq("acct_5", 10))
		if err := c.Set(ctx, store.ReservationKey("acct_5", d.Reservation), "garbage", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Settle(ctx, d.Reservation, 1); !errors.Is(err, enforcement.ErrAlreadySettled) {
			t.Fatalf("settle over a foreign value: %v (want it refused, charging nothing)", err)
		}
	})
}

func TestReserveSettleOnCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, 3)
	rdb := clusterClient(t, cl)
	shared := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "clr"})
	runShared(t, shared)
	ctx := context.Background()
	if err := shared.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	lim := enforcement.Limit{Rate: 1e-6, Burst: 100}
	l := reserveOn(t, shared, shared, lim, time.Minute)
	store := shared.Store()
	for i := range 6 { // keys on every master
		key := fmt.Sprintf("acct_%d", i)
		reserveRules(t, l, key)
		d, _ := l.Check(ctx, enforcement.Request{Key: key, Scope: "other", Cost: 1, HasCost: true, Reserve: true})
		rk := store.ReservationKey(key, d.Reservation)
		if keyslot.Slot(rk) != keyslot.Slot(store.BucketKey(key, "tokens")) {
			t.Fatalf("record %q is not in its bucket's slot", rk)
		}
		want, err := rdb.ClusterKeySlot(ctx, rk).Result()
		if err != nil || uint16(want) != keyslot.Slot(rk) {
			t.Fatalf("slot of %q: redis %d, ours %d (%v)", rk, want, keyslot.Slot(rk), err)
		}
	}
}

// TestReserveSettleExactAcrossInstances: four limiters, each with its own
// connection (two on the plain store, one script call each, two on the
// shared store, whose calls ride the pipeline's batches mixed with each
// other), run a random mix of reserve, settle (some twice, some after
// the TTL), charge and cost-0 checks on one key at once; at the end the
// bucket Redis holds is exactly burst + refill − Σ actual costs, where a
// reservation nobody settled in time costs its estimate and the refill is
// the rate over the bucket's own first and last instants.
func TestReserveSettleExactAcrossInstances(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	const burst, key = 5000, "acct_llm"
	lim := enforcement.Limit{Rate: 0.5, Burst: burst}
	ctx := context.Background()
	first := newClient(t, r.Addr())
	s0, err := reserveOn(t, redisstore.New(first, "x"), redisstore.New(first, "x"), lim, time.Second).Charge(ctx, chargeReq(key, 1000))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	spent := int64(1000)
	var wg sync.WaitGroup
	for inst := range 4 {
		c := newClient(t, r.Addr())
		var l *enforcement.Limiter
		if inst%2 == 0 {
			st := redisstore.New(c, "x")
			l = reserveOn(t, st, st, lim, 20*time.Millisecond)
		} else {
			st := redisstore.NewShared(c, redisstore.SharedConfig{Prefix: "x", Guard: redisstore.GuardSettings{Timeout: time.Minute, MaxWait: time.Minute}})
			runShared(t, st)
			l = reserveOn(t, st, st, lim, 20*time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(inst), 3))
			var ids []string
			var ests []int64
			local := int64(0)
			for range 300 {
				switch op := rng.IntN(10); {
				case op < 4:
					est := 1 + rng.Int64N(30)
					d, err := l.Check(ctx, reserveReq(key, est))
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						local += est
						ids, ests = append(ids, d.Reservation), append(ests, est)
					}
				case op < 7 && len(ids) > 0:
					i := rng.IntN(len(ids))
					if rng.IntN(4) == 0 {
						time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond) // some outlive the TTL
					}
					actual := rng.Int64N(60)
					_, err := l.Settle(ctx, ids[i], actual)
					switch {
					case err == nil:
						local += actual - ests[i]
						ests[i] = actual // a second settle must not charge again
					case errors.Is(err, enforcement.ErrAlreadySettled), errors.Is(err, enforcement.ErrReservationNotFound):
					default:
						t.Error(err)
						return
					}
				case op < 8:
					c := rng.Int64N(20)
					if _, err := l.Charge(ctx, chargeReq(key, c)); err != nil {
						t.Error(err)
						return
					}
					local += c
				default:
					if _, err := l.Check(ctx, chargeReq(key, 0)); err != nil {
						t.Error(err)
						return
					}
				}
			}
			mu.Lock()
			spent += local
			mu.Unlock()
		}()
	}
	wg.Wait()
	b, found, err := redisstore.ReadBucket(ctx, first, redisstore.New(first, "x").BucketKey(key, "tokens"))
	if err != nil || !found {
		t.Fatalf("bucket: %v (found %v)", err, found)
	}
	refill := lim.Rate * float64(b.TS-s0.Now.UnixMicro()) / 1e6
	want := float64(burst) + refill - float64(spent)
	if math.Abs(b.Tokens-want) > 1e-6 || want >= burst {
		t.Fatalf("bucket %.9f tokens, want %d + %.9f − %d = %.9f", b.Tokens, burst, refill, spent, want)
	}
	t.Logf("spent %d, refill %.3f, bucket %.3f", spent, refill, b.Tokens)
}

// TestSettleWhileRedisIsStoppedIsAppliedOnce: with redis-server stopped
// (SIGSTOP: the connection stays open and the commands sent wait in it,
// so they land when it resumes), a settle and a charge time out and are
// queued; once Redis answers, the queue is applied, and each of them
// counts once although the first try landed too.
func TestSettleWhileRedisIsStoppedIsAppliedOnce(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	lim := enforcement.Limit{Rate: 1e-6, Burst: 1000}
	ctx := context.Background()
	plain := redisstore.New(newClient(t, r.Addr()), "stop")
	reserver := reserveOn(t, plain, plain, lim, time.Minute)
	d, err := reserver.Check(ctx, reserveReq("acct", 100))
	if err != nil || d.Reservation == "" {
		t.Fatalf("reserve: %+v %v", d, err)
	}

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	shared := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "stop", Guard: redisstore.GuardSettings{Timeout: 50 * time.Millisecond}})
	runShared(t, shared)
	settler := reserveOn(t, shared, shared, lim, time.Minute)

	proc := r.Process()
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = proc.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	s, err := settler.Settle(ctx, d.Reservation, 300)
	if err != nil || !s.Queued {
		t.Fatalf("settle while stopped: %+v %v", s, err)
	}
	if s, err = settler.Charge(ctx, chargeReq("acct", 50)); err != nil || !s.Queued {
		t.Fatalf("charge while stopped: %+v %v", s, err)
	}
	resume()
	for settler.DrainSettles(ctx) > 0 { // the breaker may hold calls back a while; however long that is
		time.Sleep(10 * time.Millisecond)
	}
	if s, err = plain.Settle(ctx, "acct", "tokens", "probe", lim, 0, true, time.Minute); err != nil || s.Remaining != 1000-300-50 {
		t.Fatalf("after the queue: %+v %v, want %d left", s, err, 1000-300-50)
	}
	if _, err := reserver.Settle(ctx, d.Reservation, 300); !errors.Is(err, enforcement.ErrAlreadySettled) {
		t.Fatalf("settle after the queue applied it: %v", err)
	}
}

// alter changes one character of id's random part (a forged id).
func alter(id string) string {
	b := []byte(id)
	if b[4] == 'A' {
		b[4] = 'B'
	} else {
		b[4] = 'A'
	}
	return string(b)
}
