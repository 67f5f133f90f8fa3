package consumer

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// The tiers' boundary (window 10: generations of 5 positions): a copy
// whose original is within the window is a duplicate, also when its
// original is in an older generation; a copy whose original was forgotten
// is late (looked up), never taken for a fresh event; a new event newer
// than everything forgotten is fresh.
func TestDedupBoundary(t *testing.T) {
	d := newDedup(maphash.MakeSeed(), 10)
	for off := int64(0); off < 10; off++ {
		if v := d.add(string(rune('a'+off)), off, 1000+off); v != fresh {
			t.Fatalf("offset %d: %v, want fresh", off, v)
		}
	}
	if v := d.add("a", 10, 1000); v != duplicate {
		t.Fatalf("a copy 10 positions after its original: %v, want duplicate", v)
	}
	for off := int64(11); off < 16; off++ { // position 15 starts a fourth generation: 0–4 are forgotten
		d.add(fmt.Sprint("x", off), off, 1100+off)
	}
	if v := d.add("a", 16, 1000); v != late {
		t.Fatalf("a copy of a forgotten original: %v, want late", v)
	}
	if v := d.add("g", 17, 1006); v != duplicate {
		t.Fatalf("a copy of position 6, two generations back: %v, want duplicate", v)
	}
	if v := d.add("new", 18, 2000); v != fresh {
		t.Fatalf("a new event newer than everything forgotten: %v, want fresh", v)
	}
	if v := d.add("old", 19, 1000); v != late {
		t.Fatalf("an unseen event older than something forgotten: %v, want late", v)
	}
	if v := d.add("old", 19, 1000); v != fresh {
		t.Fatalf("the same message again at its own offset: %v, want fresh (not a duplicate)", v)
	}
	if n := d.newest(); n != 2000 {
		t.Fatalf("newest: %d, want 2000", n)
	}
}

// Against a model that remembers everything, on a stream with copies at
// random distances and decision times that wander: memory never calls a
// copy fresh nor a first occurrence a duplicate, finds every copy whose
// original is within the window, and calls late only what is older than
// something it forgot.
func TestDedupAgreesWithAModel(t *testing.T) {
	t.Run("3 generations", func(t *testing.T) { agreesWithAModel(t, 64, 20000) })
	// More generations than three, the last one part of the window.
	t.Run("many generations", func(t *testing.T) { agreesWithAModel(t, 5*maxSpan+maxSpan/3, 200_000) })
}

func agreesWithAModel(t *testing.T, window, positions int64) {
	rng := rand.New(rand.NewPCG(1, 2))
	d := newDedup(maphash.MakeSeed(), window)
	first := map[string]int64{} // id → first position
	tsOf := map[string]int64{}
	var ids []string
	for off := int64(0); off < positions; off++ {
		var id string
		if len(ids) > 0 && rng.IntN(4) == 0 {
			id = ids[len(ids)-1-rng.IntN(min(len(ids), 3*int(window)))] // a copy, up to three windows back
		} else {
			id = fmt.Sprint("e", off)
			ids = append(ids, id)
			tsOf[id] = 1_000_000 + off*10 + int64(rng.IntN(200)) - 100 // decision times out of order by up to 20 positions
		}
		ts := tsOf[id]
		v := d.add(id, off, ts)
		orig, seen := first[id]
		switch {
		case !seen && v == duplicate:
			t.Fatalf("position %d: a first occurrence called a duplicate", off)
		case seen && v == fresh:
			t.Fatalf("position %d: a copy of position %d called fresh", off, orig)
		case seen && off-orig <= window && v != duplicate:
			t.Fatalf("position %d: a copy of position %d, within the window, called %v", off, orig, v)
		case v == late && ts > d.older:
			t.Fatalf("position %d: late, but newer than everything forgotten", off)
		}
		if !seen {
			first[id] = off
		}
	}
}

// A healthy stream: ids in order, decision times that grow with the
// positions (200 per millisecond), no copies.
func BenchmarkDedupAdd(b *testing.B) {
	ids := make([]string, 1<<20)
	for i := range ids {
		ids[i] = fmt.Sprintf("01JD%022d", i)
	}
	d := newDedup(maphash.MakeSeed(), DefaultDedupWindow)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if d.add(ids[i%len(ids)], int64(i), 1_000_000+int64(i/200)) != fresh {
			b.Fatal("not fresh")
		}
	}
}
