package fleet_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/fleet"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// eventually waits, generously, until cond holds; what names what it waits for.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(30 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after 30 s waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running is one member's heartbeat, running until its stop (which leaves
// the fleet) or the test's end.
type running struct {
	*fleet.Heartbeat
	stop func()
}

func start(t *testing.T, store fleet.Store, member string, seen *atomic.Int64) running {
	t.Helper()
	h, err := fleet.New(store, fleet.Config{Member: member, Every: 50 * time.Millisecond, TTL: 2 * time.Second,
		OnCount: func(n int) { seen.Store(int64(n)) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return running{h, stop}
}

func TestFleetCountFollowsJoinsLeavesAndSurvivesTheStore(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	store := redisstore.New(rdb, "fleettest")

	var seen [4]atomic.Int64
	hs := make([]running, 0, 4)
	for i := range 4 {
		hs = append(hs, start(t, store, fmt.Sprintf("i%d", i), &seen[i]))
	}
	eventually(t, "every instance to count 4", func() bool {
		for i := range hs {
			if hs[i].Count() != 4 || seen[i].Load() != 4 {
				return false
			}
		}
		return true
	})

	// Two leave gracefully: the others count 2 at their next beat.
	for _, h := range hs[2:] {
		h.stop()
	}
	eventually(t, "the remaining two to count 2", func() bool { return hs[0].Count() == 2 && hs[1].Count() == 2 })

	// One that beat once and died (no leave) stops counting after the TTL.
	if n, err := store.Beat(context.Background(), "crashed", 2*time.Second); err != nil || n != 3 {
		t.Fatalf("phantom beat: %d %v, want 3", n, err)
	}
	eventually(t, "the others to count the crashed member", func() bool { return hs[0].Count() == 3 && hs[1].Count() == 3 })
	eventually(t, "the crashed member to expire after its TTL", func() bool { return hs[0].Count() == 2 && hs[1].Count() == 2 })

	// The store goes away: the count last read stays, and the heartbeat says it is failing.
	r.Close()
	eventually(t, "the heartbeat to notice the store is gone", func() bool { return hs[0].Failing() && hs[1].Failing() })
	if hs[0].Count() != 2 {
		t.Fatalf("count while the store is down = %d, want the last reading 2", hs[0].Count())
	}
	// It comes back empty: the beats rebuild the count without a restart.
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the count to come back from an empty store", func() bool {
		return !hs[0].Failing() && hs[0].Count() == 2 && hs[1].Count() == 2
	})
}

func TestNewNeedsAMember(t *testing.T) {
	if _, err := fleet.New(nil, fleet.Config{}); err == nil {
		t.Fatal("a heartbeat without a member name started")
	}
}
