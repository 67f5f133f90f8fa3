package enforcement_test

import (
	"context"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
)

// TestLocalViewAndForget: the local view shows what a rejection taught
// the entry; Forget drops it, so the next decision asks the store.
func TestLocalViewAndForget(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(0.001, 3), Now: clk.Now})
	ctx := context.Background()
	if v := l.LocalView("k", "s"); v.Held {
		t.Fatalf("a key never decided: %+v", v)
	}
	for range 4 {
		if _, err := l.Check(ctx, req("k", 1)); err != nil {
			t.Fatal(err)
		}
	}
	v := l.LocalView("k", "s")
	if !v.Held || !v.StoreKnown || !v.Trusted || v.StoreTokens >= 1 || v.RejectingUntil.IsZero() || v.Burst != 3 {
		t.Fatalf("after the store rejected: %+v", v)
	}
	d, err := l.Check(ctx, req("k", 1))
	if err != nil || d.Allowed || d.Source != enforcement.SourceLocal {
		t.Fatalf("a repeat is rejected locally: %+v %v", d, err)
	}
	calls := auth.calls.Load()
	if !l.Forget("k", "s") {
		t.Fatal("Forget found nothing")
	}
	if v := l.LocalView("k", "s"); v.StoreKnown || !v.RejectingUntil.IsZero() {
		t.Fatalf("after Forget: %+v", v)
	}
	if d, err := l.Check(ctx, req("k", 1)); err != nil || d.Source != enforcement.SourceShared || auth.calls.Load() != calls+1 {
		t.Fatalf("after Forget the store decides: %+v %v", d, err)
	}
	if l.Forget("other", "s") {
		t.Fatal("Forget of a key never seen found something")
	}
}
