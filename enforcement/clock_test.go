package enforcement

import (
	"context"
	"testing"
	"time"
)

// The default clock reads the monotonic clock alone and places it on the
// wall clock through an anchor: without a step of the machine's clock, the
// wall time it gives lies between two wall readings taken around it (a
// millisecond's slack for the two readings inside time.Now, never for
// speed: the bounds are read before and after).
func TestDefaultClockWallTimeMatchesTheWallClock(t *testing.T) {
	l, err := New(Config{Authority: NewMemoryAuthority(nil, 10), Policy: fixedPolicy{}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		before := time.Now()
		r := l.read()
		after := time.Now()
		got := l.wall(r)
		if got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
			t.Fatalf("wall time %v outside [%v, %v]", got, before, after)
		}
		if off := l.wallAfter(r, time.Second).Sub(got); off != time.Second {
			t.Fatalf("wallAfter(1s) is %v after wall", off)
		}
		if micros(r.off) < 1 {
			t.Fatalf("µs on the clock %d < 1", micros(r.off))
		}
		l.reanchor() // the next round reads through a fresh anchor
	}
}

type fixedPolicy struct{}

func (fixedPolicy) Resolve(string, string, string) (Resolved, error) {
	return Resolved{Limit: Limit{Rate: 10, Burst: 10}, Policy: "p", Tier: "t", Cost: 1}, nil
}

// Run is the limiter's and the memory authority's background work: it
// ends, returning nil, when its context does, and the limiter decides
// before, during and after it.
func TestRunEndsWithItsContext(t *testing.T) {
	mem := NewMemoryAuthority(nil, 10)
	l, err := New(Config{Authority: mem, Policy: fixedPolicy{}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		if d, err := l.Check(t.Context(), Request{Key: "k", Scope: "s"}); err != nil || !d.Allowed {
			t.Fatalf("%s Run: %+v %v", when, d, err)
		}
	}
	check("before")
	ctx, cancel := context.WithCancel(t.Context())
	errs := make(chan error, 2)
	go func() { errs <- l.Run(ctx) }()
	go func() { errs <- mem.Run(ctx) }()
	check("during")
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	}
	check("after")
}
