package enforcement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// TestPeekSpendsNothing: peeks answer as Check would, and neither the
// store, the local tier, the observer nor the recorder sees them.
func TestPeekSpendsNothing(t *testing.T) {
	clk := newClock()
	mem := enforcement.NewMemoryAuthority(clk.Now, 1<<20)
	obs := &observer{}
	l := newLimiter(t, enforcement.Config{Authority: mem, Policy: policyOf(1, 5), Now: clk.Now, Observer: obs})
	ctx := context.Background()
	peek := func(cost int64) enforcement.Decision {
		t.Helper()
		r := req("k", cost)
		r.Peek = true
		d, err := l.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if d.Source != enforcement.SourceShared {
			t.Fatalf("peek source %v, want shared", d.Source)
		}
		return d
	}
	for range 100 {
		if d := peek(1); !d.Allowed || d.Remaining != 4 {
			t.Fatalf("peek of a fresh key = allowed %v, remaining %d; want allowed, 4", d.Allowed, d.Remaining)
		}
	}
	if n := l.Entries(); n != 0 {
		t.Fatalf("peeks made %d local entries, want 0", n)
	}
	if n := mem.Len(); n != 0 {
		t.Fatalf("peeks made %d store buckets, want 0", n)
	}
	var decided int64
	obs.bySource.Range(func(_, v any) bool { decided += v.(interface{ Load() int64 }).Load(); return true })
	if decided != 0 {
		t.Fatalf("the observer saw %d decisions of peeks", decided)
	}
	for i := range 5 {
		if d, err := l.Check(ctx, req("k", 1)); err != nil || !d.Allowed {
			t.Fatalf("check %d after peeks: %+v, %v", i, d, err)
		}
	}
	d := peek(1)
	if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Fatalf("peek of an empty bucket: allowed %v, retry %v; want rejected within 1 s", d.Allowed, d.RetryAfter)
	}
	clk.Add(d.RetryAfter)
	if d, err := l.Check(ctx, req("k", 1)); err != nil || !d.Allowed {
		t.Fatalf("check after the peek's retry time: %+v, %v", d, err)
	}
}

// TestPeekWithoutPeeker: a store that cannot read without spending is
// refused, not spent.
func TestPeekWithoutPeeker(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(1, 5), Now: clk.Now})
	r := req("k", 1)
	r.Peek = true
	if _, err := l.Check(context.Background(), r); !errors.Is(err, enforcement.ErrPeekUnsupported) {
		t.Fatalf("peek without a Peeker: %v, want ErrPeekUnsupported", err)
	}
	if n := auth.calls.Load(); n != 0 {
		t.Fatalf("the store was called %d times", n)
	}
}
