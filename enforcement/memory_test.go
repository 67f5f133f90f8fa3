package enforcement_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
)

func TestMemoryAuthorityContract(t *testing.T) {
	authoritytest.Run(t, enforcement.NewMemoryAuthority(nil, 1000))
}

func TestMemoryAuthoritySweepForgetsOnlyFullBuckets(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)
	m := enforcement.NewMemoryAuthority(func() time.Time { return now }, 1000)
	lim := enforcement.Limit{Rate: 1, Burst: 2}
	if _, err := m.Take(context.Background(), "k", "s", lim, 2); err != nil {
		t.Fatal(err)
	}
	if n := m.Sweep(now.Add(time.Second)); n != 0 || m.Len() != 1 {
		t.Fatalf("half-refilled bucket swept: removed %d, len %d", n, m.Len())
	}
	if n := m.Sweep(now.Add(2 * time.Second)); n != 1 || m.Len() != 0 {
		t.Fatalf("full bucket kept: removed %d, len %d", n, m.Len())
	}
}
