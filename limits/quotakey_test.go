package limits

import (
	"testing"
	"time"
)

// The layout is a storage format shared by the limiter and the accounting
// side: changing it strands every live counter, so it is pinned here.
func TestQuotaKeyLayout(t *testing.T) {
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	if got, want := QuotaKey("", "acct_1", "tier:pro", start), "rl:{acct_1}:q:tier:pro:1793491200"; got != want {
		t.Errorf("QuotaKey = %q, want %q", got, want)
	}
	if got, want := QuotaKey("t9", "k", "rule:big", start), "t9:{k}:q:rule:big:1793491200"; got != want {
		t.Errorf("QuotaKey = %q, want %q", got, want)
	}
	if got := QuotaKeyExpiry(start); !got.Equal(start.Add(time.Minute)) {
		t.Errorf("QuotaKeyExpiry = %v", got)
	}
}
