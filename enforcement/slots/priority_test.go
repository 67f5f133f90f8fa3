package slots_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestCriticalKeepsItsShareUnderOverload: sheddable traffic (share 0.5)
// floods a key of N = 20 slots from many goroutines on several clients,
// five times more callers than the key has slots, taking and releasing as
// fast as it can; critical callers meanwhile take and give back slots of
// their own. Critical's guarantee is N − ⌊0.5 × N⌋ = 10: every critical
// acquire made while fewer than 10 critical slots are held must be
// admitted, whatever the flood does, because sheddable callers are
// admitted only while fewer than 10 slots in all are held. The figure
// printed is admitted ÷ attempted within the guarantee (goal 1.00; the
// issue's target is ≥ 0.98), and the sheddable callers must have been
// shed, else the flood pressed on nothing.
func TestCriticalKeepsItsShareUnderOverload(t *testing.T) {
	r := testenv.StartRedis(t)
	const n, share = 20, 0.5
	guaranteed := int64(n) - slots.ClassLimit(share, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var shed, floodAdmitted atomic.Int64
	errs := make(chan error, 256)
	var flood sync.WaitGroup
	for c := range 4 {
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
		defer rdb.Close()
		st := redisstore.NewConcurrency(rdb, "prio")
		for range 25 { // 100 sheddable callers: 5 × N
			flood.Add(1)
			go func() {
				defer flood.Done()
				for ctx.Err() == nil {
					s := slots.Slot{Key: "backend", Scope: "reports", Member: slots.NewMember()}
					g, err := st.Acquire(ctx, s, slots.ClassLimit(share, n), n, time.Minute)
					if ctx.Err() != nil {
						return
					}
					if err != nil {
						errs <- fmt.Errorf("client %d: %w", c, err)
						return
					}
					if !g.Admitted {
						shed.Add(1)
						continue
					}
					floodAdmitted.Add(1)
					if _, err := st.Release(context.WithoutCancel(ctx), s); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	// Critical callers, as many as the guarantee: each holds at most one
	// slot, so every acquire of theirs is within it; `within` counts the
	// acquires made while the critical holders, this one included, were at
	// most the guarantee (all of them here, by construction).
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	st := redisstore.NewConcurrency(rdb, "prio")
	var criticalHeld, within, withinAdmitted atomic.Int64
	var crit sync.WaitGroup
	for range int(guaranteed) {
		crit.Add(1)
		go func() {
			defer crit.Done()
			for i := 0; i < 60; i++ {
				s := slots.Slot{Key: "backend", Scope: "reports", Member: slots.NewMember()}
				before := criticalHeld.Add(1) // this caller's slot counted before it is asked for
				g, err := st.Acquire(context.Background(), s, n, n, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if before <= guaranteed {
					within.Add(1)
					if g.Admitted {
						withinAdmitted.Add(1)
					}
				}
				if g.Admitted {
					if _, err := st.Release(context.Background(), s); err != nil {
						errs <- err
						return
					}
				}
				criticalHeld.Add(-1)
			}
		}()
	}
	crit.Wait()
	cancel()
	flood.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ratio := float64(withinAdmitted.Load()) / float64(within.Load())
	t.Logf("critical admitted within its guarantee of %d slots of %d: %d of %d = %.3f (goal ≥ 0.98); sheddable admitted %d, shed %d",
		guaranteed, n, withinAdmitted.Load(), within.Load(), ratio, floodAdmitted.Load(), shed.Load())
	if within.Load() == 0 || ratio < 1 {
		t.Fatalf("critical traffic lost its guaranteed share: %.3f", ratio)
	}
	if shed.Load() == 0 {
		t.Fatal("the sheddable flood was never shed: it did not press on the limit")
	}
}
