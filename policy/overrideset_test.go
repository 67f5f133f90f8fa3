package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
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

// TestOverrideTagKeepsWhoAndWhy: a tag's author, reason and message come
// back from Tag and EachTagged as they were put, one text held once for
// many overrides; a snapshot keeps the text it saw while the set replaces
// it; and the note costs the entry no byte.
func TestOverrideTagKeepsWhoAndWhy(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 88 {
		t.Fatalf("an entry is %d bytes, want 88", n)
	}
	s := NewOverrides(0)
	bulk := OverrideTag{Revision: 7, SHA: 9, Author: "alice/billing", Reason: "contract 77", Message: "the Q4 deals"}
	for i := range 100 {
		s.PutTagged(OverrideKey{Key: fmt.Sprintf("k%d", i)}, Override{Tier: "pro", Reason: "ignored: the tag's is kept"}, bulk)
	}
	s.PutTagged(OverrideKey{Key: "k0", Scope: "api"}, Override{Tier: "ent"}, OverrideTag{Revision: 8, Author: "bob", Reason: "incident 12"})
	s.Put(OverrideKey{Key: "cached"}, Override{Tier: "pro", Reason: "cached"})
	if len(s.notes) != 2 {
		t.Fatalf("%d notes held, want 2 (one per distinct text)", len(s.notes))
	}
	for k, want := range map[OverrideKey]OverrideTag{
		{Key: "k42"}:              bulk,
		{Key: "k0", Scope: "api"}: {Revision: 8, Author: "bob", Reason: "incident 12"},
		{Key: "cached"}:           {},
	} {
		if got, ok := s.Tag(k); !ok || got != want {
			t.Errorf("Tag(%+v) = %+v, %v; want %+v", k, got, ok, want)
		}
	}
	snap := s.Snapshot()
	s.PutTagged(OverrideKey{Key: "k42"}, Override{Tier: "ent"}, OverrideTag{Revision: 9, Author: "carol", Reason: "upgrade"})
	if got, _ := snap.Tag(OverrideKey{Key: "k42"}); got != bulk {
		t.Errorf("the snapshot's tag changed: %+v", got)
	}
	if got, _ := s.Tag(OverrideKey{Key: "k42"}); got.Author != "carol" || got.Reason != "upgrade" || got.Revision != 9 {
		t.Errorf("the set's tag: %+v", got)
	}
	seen := 0
	snap.EachTagged(func(k OverrideKey, _ Override, tag OverrideTag) {
		if k.Scope == "" && k.Key != "cached" {
			seen++
			if tag != bulk {
				t.Errorf("EachTagged %+v: %+v", k, tag)
			}
		}
	})
	if seen != 100 {
		t.Errorf("EachTagged saw %d bulk overrides, want 100", seen)
	}
}
