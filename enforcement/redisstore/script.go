package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Script is a spending script for another package's state in the same
// Redis (enforcement/global's pools): EVALSHA, then EVAL on NOSCRIPT, each
// sent at most once (spend.go says why).
type Script struct{ s spendScript }

// NewScript is the spending script of Lua source src.
func NewScript(src string) Script { return Script{newSpendScript(src)} }

// Run runs the script over keys (one Cluster slot) with args.
func (s Script) Run(ctx context.Context, rdb redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return s.s.run(ctx, rdb, keys, args...)
}

// Load loads the script into every reachable server.
func (s Script) Load(ctx context.Context, rdb redis.Scripter) error {
	return s.s.Load(ctx, rdb).Err()
}

// LeaseSource is the Lua of the lease and return (state.lua and lease.lua:
// the function lease(bkey, rate, burst, mode, a, want, now_us)), for a
// script that leases from the same buckets beside other work.
func LeaseSource() string { return stateLua + leaseLua }

// BucketScriptSource is the Lua source of the bucket script, for tools that
// load it themselves (redis-benchmark comparisons).
func BucketScriptSource() string { return stateLua + decideLua + bucketLua }
