package split_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/split"
)

// TestReserveSettleOnASplitKey: a key split 4 ways reserves, settles and
// charges on the sub-buckets its decisions spend (never on the unsplit
// key's bucket, which no decision reads), the settle on the sub-bucket its
// reservation spent; at the end the sub-buckets together hold exactly
// burst − Σ actual costs, and settling twice charges once.
func TestReserveSettleOnASplitKey(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)
	mem := enforcement.NewMemoryAuthority(func() time.Time { return now }, 1<<20)
	r := split.NewReserver(mem)
	lim := enforcement.Limit{Rate: 1e-9, Burst: 4000, Split: 4}
	ctx := context.Background()
	spent := int64(0)
	ids := []string{"id-a", "id-b", "id-c", "id-d", "id-e", "id-f", "id-g", "id-h"}
	for i, id := range ids {
		v, err := r.Reserve(ctx, "k", "s", lim, 100, id, time.Minute)
		if err != nil || !v.Allowed {
			t.Fatalf("reserve %s: %+v, %v", id, v, err)
		}
		actual := int64(50 + 30*i) // some below the estimate, some above
		if _, err := r.Settle(ctx, "k", "s", id, lim, actual, false, time.Minute); err != nil {
			t.Fatalf("settle %s: %v", id, err)
		}
		if _, err := r.Settle(ctx, "k", "s", id, lim, actual, false, time.Minute); !errors.Is(err, enforcement.ErrAlreadySettled) {
			t.Fatalf("second settle of %s: %v", id, err)
		}
		spent += actual
	}
	if _, err := r.Settle(ctx, "k", "s", "charge-1", lim, 77, true, time.Minute); err != nil {
		t.Fatal(err)
	}
	spent += 77
	left, used := int64(0), 0
	for i := range 4 {
		// Cost 0 reads a sub-bucket without spending.
		v, err := mem.Take(ctx, split.SubKey("k", i), "s", split.SubLimit(lim), 0)
		if err != nil {
			t.Fatal(err)
		}
		left += v.Remaining
		if v.Remaining != split.SubLimit(lim).Burst {
			used++
		}
	}
	if left != lim.Burst-spent || used < 2 {
		t.Fatalf("sub-buckets hold %d (%d of 4 used), want %d − %d = %d", left, used, lim.Burst, spent, lim.Burst-spent)
	}
	// The unsplit key's bucket, which no decision reads, was never touched.
	if v, _ := mem.Take(ctx, "k", "s", enforcement.Limit{Rate: 1e-9, Burst: 4000}, 0); v.Remaining != 4000 {
		t.Fatalf("the unsplit bucket was spent: %+v", v)
	}
}
