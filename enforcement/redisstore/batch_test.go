package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestBatchReportNamesTheBatch: a decision that carries a BatchReport
// learns how many decisions shared its round trip. MinBatch holds the
// batch until all four callers are queued (MaxDelay is far beyond any
// machine's scheduling delay), so the size is exact, not timing-dependent.
func TestBatchReportNamesTheBatch(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	lim := enforcement.Limit{Rate: 1, Burst: 10}

	lone := newPipelined(t, rdb, "breport1")
	var rep redisstore.BatchReport
	if _, err := lone.Take(redisstore.WithBatchReport(context.Background(), &rep), "k", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	if rep.Size != 1 {
		t.Fatalf("a lone decision: batch size %d, want 1", rep.Size)
	}

	p := redisstore.NewPipelined(rdb, "breport4", redisstore.PipelineConfig{MinBatch: 4, MaxDelay: time.Minute})
	running(t, p)
	reps := make([]redisstore.BatchReport, 4)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(redisstore.WithBatchReport(context.Background(), &reps[i]), 2*time.Minute)
			defer cancel()
			if _, err := p.Take(ctx, fmt.Sprintf("k%d", i), "s", lim, 1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, rep := range reps {
		if rep.Size != 4 {
			t.Errorf("decision %d: batch size %d, want 4", i, rep.Size)
		}
	}
}

// TestBatchMixesEveryKindOfCall: a decision, a reservation, its settle's
// neighbour (a charge), a settle of an id that does not exist, a slot
// taken and a release of a slot never held ride one script call (MinBatch
// holds the batch until all six are queued, in whatever order) and each
// gets its own answer, as alone.
func TestBatchMixesEveryKindOfCall(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	const calls = 6
	p := redisstore.NewPipelined(rdb, "bmix", redisstore.PipelineConfig{MinBatch: calls, MaxDelay: time.Minute})
	running(t, p)
	slotStore := p.Concurrency()
	lim := enforcement.Limit{Rate: 1e-6, Burst: 100}
	reps := make([]redisstore.BatchReport, calls)
	ctxOf := func(i int) (context.Context, context.CancelFunc) {
		return context.WithTimeout(redisstore.WithBatchReport(context.Background(), &reps[i]), 2*time.Minute)
	}
	var wg sync.WaitGroup
	run := func(i int, f func(ctx context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := ctxOf(i)
			defer cancel()
			f(ctx)
		}()
	}
	run(0, func(ctx context.Context) {
		if v, err := p.Take(ctx, "k0", "s", lim, 10); err != nil || !v.Allowed || v.Remaining != 90 {
			t.Errorf("decision: %+v, %v", v, err)
		}
	})
	run(1, func(ctx context.Context) {
		if v, err := p.Reserve(ctx, "k1", "s", lim, 30, "id-1", time.Minute); err != nil || !v.Allowed || v.Remaining != 70 {
			t.Errorf("reservation: %+v, %v", v, err)
		}
	})
	run(2, func(ctx context.Context) {
		if s, err := p.Settle(ctx, "k2", "s", "charge-2", lim, 120, true, time.Minute); err != nil || s.Remaining != -20 || s.Debt != 20 {
			t.Errorf("charge into debt: %+v, %v", s, err)
		}
	})
	run(3, func(ctx context.Context) {
		if _, err := p.Settle(ctx, "k3", "s", "never-made", lim, 5, false, time.Minute); !errors.Is(err, enforcement.ErrReservationNotFound) {
			t.Errorf("settle of no reservation: %v", err)
		}
	})
	run(4, func(ctx context.Context) {
		if g, err := slotStore.Acquire(ctx, slot("k4"), 1, 1, time.Minute); err != nil || !g.Admitted || g.Held != 1 || !g.ExpiresAt.After(g.Now) {
			t.Errorf("slot taken: %+v, %v", g, err)
		}
	})
	run(5, func(ctx context.Context) {
		if freed, err := slotStore.Release(ctx, slot("k5")); err != nil || freed {
			t.Errorf("release of a slot never held: %v, %v", freed, err)
		}
	})
	wg.Wait()
	for i, rep := range reps {
		if rep.Size != calls {
			t.Errorf("call %d: batch size %d, want %d", i, rep.Size, calls)
		}
	}
	if held, err := slotStore.Held(context.Background(), rdb, "k4", "reports"); err != nil || held != 1 {
		t.Errorf("slots of k4 held: %d, %v; want 1", held, err)
	}
	// The reservation's settle, alone (on a lane that does not wait for
	// more), refunds what it did not use.
	if s, err := newPipelined(t, rdb, "bmix").Settle(context.Background(), "k1", "s", "id-1", lim, 10, false, time.Minute); err != nil || s.Estimate != 30 || s.Remaining != 90 {
		t.Fatalf("settle 10 of 30: %+v, %v", s, err)
	}
}
