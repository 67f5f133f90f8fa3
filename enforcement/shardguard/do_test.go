package shardguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/guard"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/shardguard"
)

// TestDoUsesTheShardsBreaker: a store call made through Do (a lease, a
// return) counts towards the breaker of the shard that owns its key, the
// one its decisions pass, and towards no other.
func TestDoUsesTheShardsBreaker(t *testing.T) {
	owner := func(slot uint16) string {
		if slot%2 == 0 {
			return "even"
		}
		return "odd"
	}
	// next is never asked: the breaker is open when Take runs.
	sg := shardguard.New(nil, owner, nil, guard.Settings{ConsecutiveFailures: 3}, nil, nil)
	var evenKey, oddKey string
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if keyslot.KeySlot(k, "s")%2 == 0 {
			evenKey = k
		} else {
			oddKey = k
		}
	}
	if evenKey == "" || oddKey == "" {
		t.Fatal("no key for one of the shards")
	}
	ctx := context.Background()
	boom := errors.New("lease script failed")
	if err := sg.Do(ctx, oddKey, "s", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := sg.Do(ctx, evenKey, "s", func(context.Context) error { return boom }); !errors.Is(err, guard.ErrStoreUnavailable) || !errors.Is(err, boom) {
			t.Fatalf("failed store call through Do: %v", err)
		}
	}
	if st := sg.States(); st["even"] != guard.Open || st["odd"] != guard.Closed {
		t.Fatalf("breakers after 3 failures on the even shard: %v", st)
	}
	if _, err := sg.Take(ctx, evenKey, "s", enforcement.Limit{Rate: 1, Burst: 1}, 1); !errors.Is(err, guard.ErrStoreUnavailable) {
		t.Fatalf("a decision on the even shard with its breaker open: %v", err)
	}
}
