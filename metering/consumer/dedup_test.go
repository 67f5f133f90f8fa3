package consumer

import (
	"hash/maphash"
	"testing"
)

// The tiers' boundary: a copy whose original has just left the window is
// late (looked up), never taken for a fresh event; one within it is a
// duplicate; a new event newer than everything forgotten is fresh.
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
	if v := d.add("a", 11, 1000); v != late {
		t.Fatalf("a copy 11 positions after its original (out of the window): %v, want late", v)
	}
	if v := d.add("new", 12, 2000); v != fresh {
		t.Fatalf("a new event newer than everything forgotten: %v, want fresh", v)
	}
	if v := d.add("old", 13, 1000); v != late {
		t.Fatalf("an unseen event older than something forgotten: %v, want late", v)
	}
	if v := d.add("old", 13, 1000); v != fresh {
		t.Fatalf("the same message again at its own offset: %v, want fresh (not a duplicate)", v)
	}
}
