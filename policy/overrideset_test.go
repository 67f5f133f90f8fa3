package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestOverrideSetAgainstAMap: random puts and deletes (keys in a few
// scopes, some routed to a store) agree with a plain map, and a snapshot keeps what it saw while
// the set changes on.
func TestOverrideSetAgainstAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := NewOverrides(0)
	want := map[OverrideKey]int64{}
	stores := map[OverrideKey]string{} // the store of each override in want
	var snap *Overrides
	var snapWant map[OverrideKey]int64
	var snapStores map[OverrideKey]string
	scopes := []string{"", "", "a", "b"}
	storeNames := []string{"", "", "acme", "big"}
	for step := range 200000 {
		k := OverrideKey{Key: fmt.Sprintf("k%d", rng.IntN(5000)), Scope: scopes[rng.IntN(len(scopes))]}
		if rng.IntN(3) == 0 {
			s.Delete(k)
			delete(want, k)
			delete(stores, k)
		} else {
			b := int64(step + 1)
			st := ""
			if k.Scope == "" {
				st = storeNames[rng.IntN(len(storeNames))]
			}
			s.Put(k, Override{Rate: 1, Burst: b, Store: st, Reason: "r"})
			want[k], stores[k] = b, st
		}
		if step%50000 == 0 {
			snap, snapWant, snapStores = s.Snapshot(), maps.Clone(want), maps.Clone(stores)
		}
	}
	check := func(name string, s *Overrides, want map[OverrideKey]int64, stores map[OverrideKey]string) {
		inUse := map[string]bool{}
		for _, st := range stores {
			if st != "" {
				inUse[st] = true
			}
		}
		if got, want := s.Stores(), slices.Sorted(maps.Keys(inUse)); !slices.Equal(got, want) {
			t.Errorf("%s: stores %v, want %v", name, got, want)
		}
		if s.Len() != len(want) {
			t.Errorf("%s: %d overrides, want %d", name, s.Len(), len(want))
		}
		n := 0
		s.Each(func(k OverrideKey, o Override) {
			n++
			if want[k] != o.Burst || stores[k] != o.Store {
				t.Errorf("%s: %v burst %d store %q, want %d %q", name, k, o.Burst, o.Store, want[k], stores[k])
			}
		})
		if n != len(want) {
			t.Errorf("%s: Each gave %d, want %d", name, n, len(want))
		}
		for i := range 5000 {
			for _, sc := range scopes {
				k := OverrideKey{Key: fmt.Sprintf("k%d", i), Scope: sc}
				e := s.entryOf(k)
				if b, ok := want[k]; ok != (e != nil) || (ok && e.burst != b) {
					t.Fatalf("%s: %v: entry %+v, want %d %v", name, k, e, b, ok)
				}
			}
		}
	}
	check("set", s, want, stores)
	check("snapshot", snap, snapWant, snapStores)
}

// TestOverrideSnapshotWhileChanging: readers of a snapshot run beside the
// set's changes (run with -race); each snapshot keeps what it saw.
func TestOverrideSnapshotWhileChanging(t *testing.T) {
	s := NewOverrides(0)
	for i := range 3000 {
		s.Put(OverrideKey{Key: fmt.Sprintf("k%d", i)}, Override{Tier: "pro", Reason: "r"})
	}
	snap := s.Snapshot()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 3000 {
			s.Put(OverrideKey{Key: fmt.Sprintf("k%d", i), Scope: "a"}, Override{Tier: "ent", Reason: "r"})
			s.Delete(OverrideKey{Key: fmt.Sprintf("k%d", i)})
			s.Put(OverrideKey{Key: fmt.Sprintf("n%d", i)}, Override{Tier: "free", Reason: "r"})
			if i%500 == 0 {
				_ = s.Snapshot()
			}
		}
	}()
	for range 3 {
		for i := range 3000 {
			scoped, own := snap.find(fmt.Sprintf("k%d", i), "a")
			if scoped != nil || own == nil || snap.tierName(own.tier) != "pro" {
				t.Fatalf("k%d: the snapshot changed: %+v %+v", i, scoped, own)
			}
		}
	}
	<-done
	if snap.Len() != 3000 || s.Len() != 6000 {
		t.Errorf("snapshot %d, set %d overrides; want 3000, 6000", snap.Len(), s.Len())
	}
}
