package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// A decision whose script call timed out may still have run: the server
// was only stopped, and runs what is in its socket when it resumes. It
// must run once, however the client retries (go-redis's MaxRetries, and a
// ClusterClient's retries on network errors bounded by MaxRedirects): the
// bucket is charged exactly once for one decision, never twice.
//
// Each case stops the server that holds the key (SIGSTOP) past the read
// timeout, takes once (the call fails), resumes the server, closes every
// client connection and waits until the server has read (and so run)
// everything its clients sent (CLIENT LIST holds only the checker), then
// reads the bucket. Nothing is timed: the server cannot answer before
// SIGCONT, whatever the machine's speed.

const (
	spendBurst = 100
	spendCost  = 7
)

// spendLimit refills about nothing over the test: one charge is 7 tokens
// below the burst, two are 14.
var spendLimit = enforcement.Limit{Rate: 1e-6, Burst: spendBurst}

func TestSpendingScriptNotResentStandalone(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	for _, name := range []string{"store", "pipelined"} {
		t.Run(name, func(t *testing.T) {
			// go-redis's default retries (3), not the limiter's -1: the
			// rule must hold whatever the client's configuration.
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: 100 * time.Millisecond,
				ContextTimeoutEnabled: true, PoolSize: 8})
			defer rdb.Close()
			key := "once-" + name
			var take func(ctx context.Context) error
			closeAll := func() { _ = rdb.Close() }
			if name == "store" {
				st := redisstore.New(rdb, "sp")
				warm(t, rdb, st, "warm-"+name)
				take = func(ctx context.Context) error { _, err := st.Take(ctx, key, "s", spendLimit, spendCost); return err }
			} else {
				p := redisstore.NewPipelined(rdb, "sp", redisstore.PipelineConfig{Timeout: 100 * time.Millisecond})
				stop := running(t, p)
				if _, err := p.Take(context.Background(), "warm-"+name, "s", spendLimit, 1); err != nil {
					t.Fatal(err)
				}
				take = func(ctx context.Context) error { _, err := p.Take(ctx, key, "s", spendLimit, spendCost); return err }
				closeAll = func() { stop(); _ = rdb.Close() }
			}
			chargedOnce(t, r.Process(), r.Addr(), "sp", key, take, closeAll)
		})
	}
}

func TestSpendingScriptNotResentCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, 3)
	for _, name := range []string{"store", "pipelined-first-call"} {
		t.Run(name, func(t *testing.T) {
			// MaxRedirects left at go-redis's default (3): it also bounds
			// the ClusterClient's retries after a network error.
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ReadTimeout: 100 * time.Millisecond,
				ContextTimeoutEnabled: true, PoolSize: 8})
			defer rdb.Close()
			ctx := context.Background()
			st := redisstore.New(rdb, "sc")
			var key string
			var master *testenv.Redis
			for i := 0; master == nil; i++ {
				key = fmt.Sprintf("once-%s-%d", name, i)
				n, err := rdb.MasterForKey(ctx, st.BucketKey(key, "s"))
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range cl.Masters {
					if m.Addr() == n.Options().Addr && m == cl.Masters[0] {
						master = m
					}
				}
			}
			// A key of the same slot's master to open connections on.
			warmKey := ""
			for i := 0; warmKey == ""; i++ {
				k := fmt.Sprintf("warm-%s-%d", name, i)
				if n, _ := rdb.MasterForKey(ctx, st.BucketKey(k, "s")); n != nil && n.Options().Addr == master.Addr() {
					warmKey = k
				}
			}
			shard, err := rdb.MasterForKey(ctx, st.BucketKey(key, "s"))
			if err != nil {
				t.Fatal(err)
			}
			warm(t, shard, st, warmKey)
			var take func(ctx context.Context) error
			closeAll := func() { _ = rdb.Close() }
			if name == "store" {
				take = func(ctx context.Context) error { _, err := st.Take(ctx, key, "s", spendLimit, spendCost); return err }
			} else {
				// A new Pipelined sends its first decisions over a Cluster
				// through the cluster client (no slot is routable yet).
				p := redisstore.NewPipelined(rdb, "sc", redisstore.PipelineConfig{Timeout: 100 * time.Millisecond})
				stop := running(t, p)
				take = func(ctx context.Context) error { _, err := p.Take(ctx, key, "s", spendLimit, spendCost); return err }
				closeAll = func() { stop(); _ = rdb.Close() }
			}
			chargedOnce(t, master.Process(), master.Addr(), "sc", key, take, closeAll)
		})
	}
}

// warm opens several connections of rdb's pool to the server (a blocking
// command on each, at once) and loads the scripts there, so that a retry
// would find a ready connection and write its call at once (a new
// connection's handshake would time out first and hide a resend).
func warm(t *testing.T, rdb redis.UniversalClient, st *redisstore.Store, key string) {
	t.Helper()
	ctx := context.Background()
	if err := st.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, key, "s", spendLimit, 1); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rdb.BLPop(ctx, time.Second, "{"+key+"}:warm").Err() // Redis's shortest wait
		}()
	}
	wg.Wait()
}

// chargedOnce stops proc, takes once (which must fail), resumes proc,
// closes the clients, waits until the server at addr has read everything
// its clients sent, and checks the bucket of key was charged once.
func chargedOnce(t *testing.T, proc *testenv.Process, addr, prefix, key string, take func(context.Context) error, closeAll func()) {
	t.Helper()
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = proc.Signal(syscall.SIGCONT)
		}
	}()
	// Long enough for every retry go-redis would make (each waits the
	// 100 ms read timeout, plus its backoff).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := take(ctx)
	cancel()
	if err == nil {
		t.Fatal("a decision was answered by a stopped server")
	}
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	closeAll()

	chk := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer chk.Close()
	bg := context.Background()
	deadline := time.Now().Add(testenv.Timeout(20 * time.Second)) // ends a broken run only
	for {
		list, err := chk.ClientList(bg).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(strings.TrimSpace(list), "\n") == 0 {
			break // only the checker: every other client was read to its end and freed
		}
		if time.Now().After(deadline) {
			t.Fatalf("clients still connected:\n%s", list)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, found, err := redisstore.ReadBucket(bg, chk, redisstore.New(chk, prefix).BucketKey(key, "s"))
	if err != nil {
		t.Fatal(err)
	}
	charges := 0.0
	if found {
		charges = (spendBurst - b.Tokens) / spendCost
	}
	if charges < 0.99 || charges > 1.01 {
		t.Fatalf("bucket %+v (found %v): charged %.2f times for one decision, want exactly once", b, found, charges)
	}
	t.Logf("one decision that timed out charged the bucket once (%.4f tokens left of %d)", b.Tokens, spendBurst)
}
