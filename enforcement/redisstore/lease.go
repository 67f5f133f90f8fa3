package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// The lease is lease.lua, one Lua function on state.lua's bucket;
// leasecall.lua runs it once per call.
var (
	//go:embed lease.lua
	leaseLua string
	//go:embed leasecall.lua
	leaseCallLua string

	leaseScript = newSpendScript(stateLua + leaseLua + leaseCallLua) // spend.go: sent at most once
)

// Lease takes between need and want whole tokens from the bucket of (key,
// scope) in one atomic step, never more than are there; when fewer than need
// are there it takes nothing and says when they will be. The bucket is the
// one Take spends (same key, same fields), so leased and unleased decisions
// share it. One round trip (EVALSHA).
func (s *Store) Lease(ctx context.Context, key, scope string, lim enforcement.Limit, need, want int64) (enforcement.Grant, error) {
	return s.lease(ctx, key, scope, lim, "lease", need, max(need, want))
}

// Return gives n unused leased tokens back to the bucket of (key, scope),
// capped at its capacity. One round trip.
func (s *Store) Return(ctx context.Context, key, scope string, lim enforcement.Limit, n int64) (enforcement.Grant, error) {
	return s.lease(ctx, key, scope, lim, "return", n, 0)
}

func (s *Store) lease(ctx context.Context, key, scope string, lim enforcement.Limit, mode string, a, b int64) (enforcement.Grant, error) {
	bucketKey := s.BucketKey(key, scope)
	res, err := leaseScript.run(ctx, s.rdb, []string{bucketKey}, lim.Rate, lim.Burst, mode, a, b).Int64Slice()
	if err != nil {
		return enforcement.Grant{}, fmt.Errorf("redis lease script (%s) for %q: %w", mode, bucketKey, err)
	}
	if len(res) != 6 {
		return enforcement.Grant{}, fmt.Errorf("redis lease script (%s) for %q: %w: %d values", mode, bucketKey, errBadReply, len(res))
	}
	return enforcement.Grant{
		Granted:    res[0],
		Left:       res[1],
		RetryAfter: time.Duration(res[2]) * time.Millisecond,
		ResetAfter: time.Duration(res[3]) * time.Millisecond,
		Now:        time.UnixMilli(res[4]),
		ClockBack:  res[5] == 1,
	}, nil
}

// PreloadLease loads the lease script into every reachable server.
func (s *Store) PreloadLease(ctx context.Context) error {
	if err := leaseScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("load lease script: %w", err)
	}
	return nil
}
