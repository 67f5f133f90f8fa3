package chsink_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering/chsink"
)

// Epochs: epoch 0 is implicit, recorded epochs come back oldest first with
// every field, and when two consumers recorded the same epoch the first
// recorded wins. LastID finds the highest raw row in a range of positions.
func TestEpochsAndLastID(t *testing.T) {
	s, _, _ := setupDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps, err := s.Epochs(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0] != (chsink.Epoch{}) {
		t.Fatalf("epochs of an unread partition: %+v, want only the implicit epoch 0", eps)
	}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	one := chsink.Epoch{Epoch: 1, Base: 900, First: 1000, Start: 100, Reason: chsink.Restarted,
		LogStart: 100, LogEnd: 400, PrevNext: 1000, Gap: 100, Detected: at}
	late := one
	late.Base, late.First, late.Detected = 950, 1050, at.Add(time.Second) // a dropped member's record
	two := chsink.Epoch{Epoch: 2, Base: 2000, First: 2000, Start: 0, Reason: chsink.Replaced, LogEnd: 3000, PrevNext: 1100, Detected: at.Add(time.Minute)}
	for _, e := range []chsink.Epoch{late, two, one} {
		if err := s.AddEpoch(ctx, 3, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddEpoch(ctx, 4, late); err != nil { // another partition's
		t.Fatal(err)
	}
	eps, err = s.Epochs(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 || eps[1] != one || eps[2] != two {
		t.Fatalf("epochs: %+v\nwant [{} %+v %+v]", eps, one, two)
	}
	if p := one.Position(150); p != 1050 || one.Offset(p) != 150 {
		t.Fatalf("epoch 1: offset 150 at position %d", p)
	}

	var p chsink.Progress
	for i := range p {
		p[i] = -1
	}
	recs := records(1000, 50, at)
	if err := s.Write(ctx, 3, recs, 1049, &p); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from, below int64
		ok          bool
		pos         int64
	}{
		{0, 2000, true, 1049}, {1000, 1049, true, 1048}, {1000, 1001, true, 1000}, {1050, 2000, false, 0}, {0, 1000, false, 0}, {5, 5, false, 0},
	} {
		id, pos, ok, err := s.LastID(ctx, 3, c.from, c.below)
		if err != nil {
			t.Fatal(err)
		}
		if ok != c.ok || pos != c.pos || (ok && id != recs[pos-1000].Event.EventID) {
			t.Errorf("LastID(%d, %d) = %q %d %v, want position %d %v", c.from, c.below, id, pos, ok, c.pos, c.ok)
		}
	}
}
