package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPipelinedClusterStoppedMasterHoldsOnlyItsKeys: a master that does
// not answer (SIGSTOP: its connections stay open and nothing comes back, as
// from a host that dropped off the network) holds up only the decisions of
// its own keys. The other masters' keys are all answered while every
// decision on the stopped one is still outstanding, whatever order the
// calls were queued in: no batch spans masters, the stopped master's
// batches occupy only workers of its own, and a script reloaded after
// NOSCRIPT is loaded where it was refused, not on every master.
//
// Nothing here is timed: the stopped master's calls cannot complete before
// SIGCONT (their deadline is a minute away), so a live key answered before
// SIGCONT was not behind them. The live calls' own bound (20 s) is only
// there to end a broken run.
func TestPipelinedClusterStoppedMasterHoldsOnlyItsKeys(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: cl.Addrs(), ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
	})
	defer rdb.Close()
	p := redisstore.NewPipelined(rdb, "pstop", redisstore.PipelineConfig{Timeout: time.Minute})
	running(t, p)
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 1e6, Burst: 1e6}

	stopped := cl.Masters[0].Addr()
	var onStopped, live []string
	for i := 0; len(onStopped) < 16 || len(live) < 32; i++ {
		k := fmt.Sprintf("k%d", i)
		n, err := rdb.MasterForKey(ctx, p.Store().BucketKey(k, "s"))
		if err != nil {
			t.Fatal(err)
		}
		if n.Options().Addr == stopped {
			onStopped = append(onStopped, k)
		} else {
			live = append(live, k)
		}
	}
	// Every key once while all masters answer: connections open, the
	// script loaded everywhere.
	for _, k := range append(append([]string{}, onStopped...), live...) {
		if _, err := p.Take(ctx, k, "s", lim, 1); err != nil {
			t.Fatal(err)
		}
	}

	// And the script gone from every master (a restart, a SCRIPT FLUSH):
	// the live masters' first calls are refused with NOSCRIPT, and loading
	// the script again must not wait for the stopped one either.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	proc := cl.Masters[0].Process()
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

	// The stopped master's decisions first, so that they are queued ahead
	// of the live ones.
	var heldDone atomic.Int64
	var held sync.WaitGroup
	for _, k := range onStopped {
		held.Add(1)
		go func() {
			defer held.Done()
			_, _ = p.Take(ctx, k, "s", lim, 1) // its answer, after SIGCONT, is not the point
			heldDone.Add(1)
		}()
	}
	var wg sync.WaitGroup
	var answered atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			for i := range 40 {
				k := live[(w*5+i)%len(live)]
				if _, err := p.Take(lctx, k, "s", lim, 1); err != nil {
					t.Errorf("%s (on a live master): %v", k, err)
					return
				}
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	outstanding := int64(len(onStopped)) - heldDone.Load()
	resume()
	held.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if outstanding != int64(len(onStopped)) {
		t.Fatalf("%d of the stopped master's %d decisions returned while it was stopped", int64(len(onStopped))-outstanding, len(onStopped))
	}
	t.Logf("%d decisions on live masters answered while all %d on the stopped master were outstanding", answered.Load(), outstanding)
}
