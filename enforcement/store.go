package enforcement

import (
	"context"
	"time"
)

// Store is the shared store as the limiter consumes it: decisions (Take),
// token leases for hot keys, and the fleet heartbeat that counts the
// instances sharing it. Every call, whatever its purpose, must be fenced
// alike by the implementation (one deadline and one breaker per shard), so
// that a dead store is not asked behind its breaker's back. Implementations
// are safe for concurrent use; redisstore.Shared is the Redis one.
type Store interface {
	Authority
	// Lease takes between need and want whole tokens from the bucket of
	// (key, scope) in one atomic step, never more than are there; when
	// fewer than need are there it takes nothing and says when they will
	// be. The bucket is the one Take spends.
	Lease(ctx context.Context, key, scope string, lim Limit, need, want int64) (Grant, error)
	// Return gives n unused leased tokens back to the bucket of (key,
	// scope), capped at its capacity.
	Return(ctx context.Context, key, scope string, lim Limit, n int64) (Grant, error)
	// Beat records member as alive on the store's clock, forgets members
	// silent for longer than ttl, and returns the live count.
	Beat(ctx context.Context, member string, ttl time.Duration) (int, error)
	// Leave removes member at once and returns the count left.
	Leave(ctx context.Context, member string, ttl time.Duration) (int, error)
}

// Grant is a store's answer to a lease or a return.
type Grant struct {
	Granted    int64         // whole tokens now held by the caller (0 for a return or a refusal)
	Left       int64         // whole tokens left in the shared bucket afterwards
	RetryAfter time.Duration // when nothing was granted: until `need` tokens are there (ms, rounded up)
	ResetAfter time.Duration // until the shared bucket is full again
	Now        time.Time     // the store's clock (ms)
	ClockBack  bool          // the store's clock was behind the bucket's last update
}
