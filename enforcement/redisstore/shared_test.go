package redisstore

import (
	"context"
	"errors"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
)

// TestDoUsesTheShardsBreaker: a store call made through do (a lease, a
// return) counts towards the breaker of the shard that owns its key, the
// one its decisions pass, and towards no other.
func TestDoUsesTheShardsBreaker(t *testing.T) {
	// next is never asked: the breaker is open when Take runs.
	s := newShared(nil, GuardSettings{ConsecutiveFailures: 3}, nil, nil)
	s.owner = func(slot uint16) string {
		if slot%2 == 0 {
			return "even"
		}
		return "odd"
	}
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
	if err := s.do(ctx, oddKey, "s", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.do(ctx, evenKey, "s", func(context.Context) error { return boom }); !errors.Is(err, ErrStoreUnavailable) || !errors.Is(err, boom) {
			t.Fatalf("failed store call through do: %v", err)
		}
	}
	if st := s.States(); st["even"] != Open || st["odd"] != Closed {
		t.Fatalf("breakers after 3 failures on the even shard: %v", st)
	}
	if !s.Failing() {
		t.Fatal("Failing is false after a failed call")
	}
	if _, err := s.Take(ctx, evenKey, "s", enforcement.Limit{Rate: 1, Burst: 1}, 1); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("a decision on the even shard with its breaker open: %v", err)
	}
	if err := s.do(ctx, oddKey, "s", func(context.Context) error { return nil }); err != nil || s.Failing() {
		t.Fatalf("a call that succeeds after the failures: %v, Failing %v", err, s.Failing())
	}
}
