package split_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestSplitKeepsTheClassFloorPerSubBucket: a key of burst 40 split in 2
// sub-buckets of 20; a class of share 0.5 leaves (1 − 0.5) × 20 = 10 in
// each, so it is admitted 10 times per sub-bucket and then shed there,
// while critical spends each down to 0: the same proportion as unsplit.
func TestSplitKeepsTheClassFloorPerSubBucket(t *testing.T) {
	r := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	turn := 0
	a := split.New(redisstore.New(c, "spfloor"), func(n int) int { turn++; return turn % n })
	ctx := context.Background()
	sheddable := enforcement.Limit{Rate: 0.001, Burst: 40, Split: 2, Share: 0.5}
	critical := sheddable
	critical.Share = 1
	count := func(lim enforcement.Limit, tries int) (allowed, shed int) {
		for range tries {
			v, err := a.Take(ctx, "k", "s", lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed {
				allowed++
			} else if v.Shed {
				shed++
			}
		}
		return allowed, shed
	}
	if allowed, shed := count(sheddable, 30); allowed != 20 || shed != 10 {
		t.Fatalf("sheddable: %d allowed, %d shed of 30; want 20 (10 per sub-bucket) and 10", allowed, shed)
	}
	if allowed, shed := count(critical, 30); allowed != 20 || shed != 0 {
		t.Fatalf("critical: %d allowed, %d shed of 30; want the 20 left and none shed", allowed, shed)
	}
}
