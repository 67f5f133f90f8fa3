package enforcement

import (
	"math/rand"
	"strconv"
	"sync"
	"testing"
)

type tableItem struct {
	id   bucketID
	idle bool
}

// get is table.get for tests that never fill the table.
func get(tb *table[tableItem], id bucketID, init func(*tableItem)) *tableItem {
	v, _ := tb.get(id, 0, init)
	return v
}

// TestTableAgreesWithAMap: random inserts, lookups and sweeps (which move
// entries back along their probe sequences), checked step by step against
// a Go map. The cap is above the 3,600 ids, so nothing is evicted.
func TestTableAgreesWithAMap(t *testing.T) {
	const maxEntries = 64 * 100
	tb := newTable(tableConfig[tableItem]{maxEntries: maxEntries})
	ref := map[bucketID]*tableItem{}
	rng := rand.New(rand.NewSource(1))
	id := func() bucketID {
		// Few keys with several scopes each, so that one key's scopes
		// share a probe sequence.
		return bucketID{"k" + strconv.Itoa(rng.Intn(900)), "s" + strconv.Itoa(rng.Intn(4))}
	}
	for step := 0; step < 40_000; step++ {
		switch op := rng.Intn(100); {
		case op < 98:
			k := id()
			got := get(tb, k, func(it *tableItem) { it.id = k })
			if got.id != k {
				t.Fatalf("step %d: get(%v) returned the entry of %v", step, k, got.id)
			}
			if want, ok := ref[k]; ok && want != got {
				t.Fatalf("step %d: get(%v) made a second entry for an id the table holds", step, k)
			}
			ref[k] = got
			got.idle = rng.Intn(3) == 0
		default:
			removed := tb.sweep(func(it *tableItem) bool { return it.idle })
			n := 0
			for k, it := range ref {
				if it.idle {
					delete(ref, k)
					n++
				}
			}
			if removed != n {
				t.Fatalf("step %d: sweep removed %d entries, want %d", step, removed, n)
			}
		}
	}
	for k, it := range ref {
		if got := get(tb, k, nil); got != it {
			t.Fatalf("%v: the table lost its entry", k)
		}
	}
	if n := tb.len(); n != len(ref) {
		t.Fatalf("the table holds %d entries, want %d", n, len(ref))
	}
}

// TestTableEvictsAtItsCap: a full shard makes room by evicting.
func TestTableEvictsAtItsCap(t *testing.T) {
	tb := newTable(tableConfig[tableItem]{maxEntries: 64 * 4})
	for i := 0; i < 10_000; i++ {
		k := bucketID{"key" + strconv.Itoa(i), "s"}
		if got := get(tb, k, func(it *tableItem) { it.id = k }); got.id != k {
			t.Fatalf("get(%v) returned %v", k, got.id)
		}
	}
	if n := tb.len(); n > 64*4 || n < 64 {
		t.Fatalf("%d entries after 10,000 inserts with a cap of %d", n, 64*4)
	}
}

// TestTableConcurrentReadersAndWriters: lookups without a lock race
// inserts, growth and sweeps (run with -race). An id that is never swept
// keeps one entry however the lookups interleave.
func TestTableConcurrentReadersAndWriters(t *testing.T) {
	tb := newTable(tableConfig[tableItem]{maxEntries: 1 << 20})
	const kept, churned = 2000, 2000
	keptID := func(i int) bucketID { return bucketID{"kept" + strconv.Itoa(i), "s"} }
	first := make([]*tableItem, kept)
	for i := range first {
		k := keptID(i)
		first[i] = get(tb, k, func(it *tableItem) { it.id = k })
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan string, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if g%2 == 0 { // churn: new ids, marked idle for the sweeper
					k := bucketID{"churn" + strconv.Itoa(rng.Intn(churned)), strconv.Itoa(g)}
					it := get(tb, k, func(it *tableItem) { it.id = k; it.idle = true })
					if it.id != k {
						errs <- "churned lookup returned another id's entry"
						return
					}
					continue
				}
				i := rng.Intn(kept)
				if it := get(tb, keptID(i), nil); it != first[i] {
					errs <- "a kept id got a second entry"
					return
				}
			}
		}(g)
	}
	for round := 0; round < 200; round++ {
		tb.sweep(func(it *tableItem) bool { return it.idle })
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}
