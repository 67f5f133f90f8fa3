package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestOpenReservationsAreIndexedPerKey: a reservation is listed in its
// key's index from the moment it is made (through the plain store's
// script, the pipelined batches, and on a Cluster) with its estimate and
// expiry, until it is settled or its record expires; a refused one is
// never listed. The index's key is where keyslot says, which is also
// where the scripts find it from a record's key.
func TestOpenReservationsAreIndexedPerKey(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	store := redisstore.New(c, "ix")
	shared := redisstore.NewShared(newClient(t, r.Addr()), redisstore.SharedConfig{Prefix: "ix"})
	runShared(t, shared)
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 1e-6, Burst: 100}

	for i, st := range []enforcement.Reserver{store, shared} {
		key := fmt.Sprintf("acct_ix%d", i)
		for j, cost := range []int64{3, 5, 7} {
			if v, err := st.Reserve(ctx, key, "tokens", lim, cost, fmt.Sprintf("r%d", j), time.Minute); err != nil || !v.Allowed {
				t.Fatalf("%T reserve %d: %+v %v", st, cost, v, err)
			}
		}
		if v, err := st.Reserve(ctx, key, "tokens", lim, 1000, "refused", time.Minute); err != nil || v.Allowed {
			t.Fatalf("%T reserve 1000 of 100: %+v %v", st, v, err)
		}
		open, list, err := store.OpenReservations(ctx, key, 10)
		if err != nil || open != 3 || len(list) != 3 {
			t.Fatalf("%T: %d open, %+v, %v; want r0, r1, r2", st, open, list, err)
		}
		want := map[string]float64{"r0": 3, "r1": 5, "r2": 7}
		for _, o := range list {
			if want[o.ID] != o.Tokens || o.Gone || time.Until(o.ExpiresAt) <= 0 || time.Until(o.ExpiresAt) > time.Minute+time.Second {
				t.Errorf("%T: listed %+v", st, o)
			}
		}
		if _, err := st.Settle(ctx, key, "tokens", "r1", lim, 4, false, time.Minute); err != nil {
			t.Fatal(err)
		}
		if open, list, err = store.OpenReservations(ctx, key, 1); err != nil || open != 2 || len(list) != 1 || list[0].ID == "r1" {
			t.Fatalf("%T after settling r1: %d open, %+v, %v; want 2 open, one listed, not r1", st, open, list, err)
		}
		if n, err := c.Exists(ctx, keyslot.ReservationIndexKey("ix", key)).Result(); err != nil || n != 1 {
			t.Fatalf("%T: the index is not at keyslot.ReservationIndexKey: %d %v", st, n, err)
		}
	}

	// A reservation whose record expires leaves the list then (its entry
	// goes at the next reservation of the key, or with the index).
	if v, err := store.Reserve(ctx, "acct_short", "tokens", lim, 2, "short", 50*time.Millisecond); err != nil || !v.Allowed {
		t.Fatalf("reserve: %+v %v", v, err)
	}
	testenv.WaitFor(t, 10*time.Second, "the expired reservation to leave the list", func() bool {
		open, list, err := store.OpenReservations(ctx, "acct_short", 10)
		if err != nil {
			t.Fatal(err)
		}
		return open == 0 && len(list) == 0
	})
	if v, err := store.Reserve(ctx, "acct_short", "tokens", lim, 2, "next", time.Minute); err != nil || !v.Allowed {
		t.Fatalf("reserve: %+v %v", v, err)
	}
	if n, err := c.ZCard(ctx, keyslot.ReservationIndexKey("ix", "acct_short")).Result(); err != nil || n != 1 {
		t.Fatalf("the index after the next reservation: %d entries (%v), want the expired one dropped", n, err)
	}
}

// On a Cluster the index shares its key's slot: the scripts that write it
// and the one that reads it run there.
func TestOpenReservationsOnCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, 3)
	rdb := clusterClient(t, cl)
	shared := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "cix"})
	runShared(t, shared)
	ctx := context.Background()
	if err := shared.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	lim := enforcement.Limit{Rate: 1e-6, Burst: 100}
	store := shared.Store()
	for i := range 6 { // keys on every master
		key := fmt.Sprintf("acct_%d", i)
		if keyslot.Slot(keyslot.ReservationIndexKey("cix", key)) != keyslot.Slot(store.BucketKey(key, "tokens")) {
			t.Fatalf("the index of %s is not in its bucket's slot", key)
		}
		if v, err := shared.Reserve(ctx, key, "tokens", lim, 4, "a", time.Minute); err != nil || !v.Allowed {
			t.Fatalf("reserve: %+v %v", v, err)
		}
		open, list, err := store.OpenReservations(ctx, key, 10)
		if err != nil || open != 1 || len(list) != 1 || list[0].Tokens != 4 {
			t.Fatalf("%s: %d open, %+v, %v", key, open, list, err)
		}
		if _, err := shared.Settle(ctx, key, "tokens", "a", lim, 4, false, time.Minute); err != nil {
			t.Fatal(err)
		}
		if open, _, err := store.OpenReservations(ctx, key, 10); err != nil || open != 0 {
			t.Fatalf("%s after the settle: %d open, %v", key, open, err)
		}
	}
}

// BenchmarkReserveAndSettle: one reservation made and settled per
// operation, one script call each, on one key (the index's cost is one
// ZREMRANGEBYSCORE, ZADD and PTTL in the reserve, one ZREM in the settle).
func BenchmarkReserveAndSettle(b *testing.B) {
	r := testenv.StartRedis(b)
	c := newClient(b, r.Addr())
	store := redisstore.New(c, "bx")
	lim := enforcement.Limit{Rate: 1e9, Burst: 1 << 40}
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("r%d", i)
		if v, err := store.Reserve(ctx, "acct_bench", "tokens", lim, 2, id, time.Minute); err != nil || !v.Allowed {
			b.Fatalf("reserve: %+v %v", v, err)
		}
		if _, err := store.Settle(ctx, "acct_bench", "tokens", id, lim, 1, false, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// Redis's own time in the scripts, per operation: what the index adds
	// to the store's one thread, apart from the client's scheduling.
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			var calls, usec int64
			for _, f := range strings.Split(strings.TrimSpace(rest), ",") {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "calls":
					calls, _ = strconv.ParseInt(v, 10, 64)
				case "usec":
					usec, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			if calls > 0 {
				b.ReportMetric(float64(usec)/float64(b.N), "redis-µs/op")
			}
		}
	}
}
