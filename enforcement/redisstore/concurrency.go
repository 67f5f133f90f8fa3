package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed slotset.lua
	slotsetLua string
	//go:embed concurrency.lua
	concurrencyLua string
)

// concurrencyScript is one slot operation (acquire, renew, release) alone,
// one atomic call each. An acquire is safe to send twice (the same member
// holds one slot), but it goes through the spend path like every script
// that changes what a key may do (spend.go).
var concurrencyScript = newSpendScript(slotsetLua + concurrencyLua)

// Slot operations (slotset.lua's op).
const (
	slotAcquire = 1
	slotRenew   = 2
	slotRelease = 3
)

var slotOpNames = [...]string{slotAcquire: "acquire", slotRenew: "renew", slotRelease: "release"}

// Concurrency is the fleet's slots of concurrency limits in Redis or Redis
// Cluster (slots.Store): one sorted set per (key, scope), under the key's
// hash tag (keyslot.SlotSetKey), so each call touches one Cluster slot.
// It is safe for concurrent use.
type Concurrency struct {
	rdb    redis.Scripter
	prefix string
	// pipe, when set, carries the calls in the auto-pipeline's batches
	// (the same function, slotset.lua, beside the decisions), as
	// Shared.Concurrency does; else each call is its own script call.
	pipe *Pipelined
}

var _ slots.Store = (*Concurrency)(nil)

// NewConcurrency returns the slot store whose keys start with prefix
// (limits.DefaultKeyPrefix when empty), over any go-redis client that runs
// scripts.
func NewConcurrency(rdb redis.Scripter, prefix string) *Concurrency {
	return &Concurrency{rdb: rdb, prefix: New(rdb, prefix).prefix}
}

// Concurrency is the slot store on s's server and key prefix.
func (s *Store) Concurrency() *Concurrency { return &Concurrency{rdb: s.rdb, prefix: s.prefix} }

// Concurrency is the slot store on p's server and key prefix, whose calls
// ride p's lanes.
func (p *Pipelined) Concurrency() *Concurrency {
	c := p.store.Concurrency()
	c.pipe = p
	return c
}

// SetKey is the Redis key of the slots of (key, scope).
func (c *Concurrency) SetKey(key, scope string) string {
	return keyslot.SlotSetKey(c.prefix, key, scope)
}

// Held is the slots of (key, scope) held now, on Redis's clock: the
// store's own view, for tests and tools.
func (c *Concurrency) Held(ctx context.Context, rdb redis.Cmdable, key, scope string) (int64, error) {
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return rdb.ZCount(ctx, c.SetKey(key, scope), fmt.Sprint(t.UnixMilli()+1), "+inf").Result()
}

// Acquire implements slots.Store in one round trip.
func (c *Concurrency) Acquire(ctx context.Context, s slots.Slot, limit, capacity int64, ttl time.Duration) (slots.Grant, error) {
	r, err := c.call(ctx, s, slotAcquire, limit, capacity, ttl.Milliseconds())
	if err != nil {
		return slots.Grant{}, err
	}
	g := slots.Grant{Admitted: r[0] == 1, Held: r[1], Now: time.UnixMilli(r[3])}
	if g.Admitted {
		g.ExpiresAt = time.UnixMilli(r[2])
		return g, nil
	}
	g.RetryAfter = time.Duration(max(1, r[2])) * time.Millisecond
	switch r[4] {
	case 1:
		g.Reason = enforcement.ReasonConcurrency
	case 2:
		g.Reason = enforcement.ReasonShed
	default:
		return slots.Grant{}, fmt.Errorf("%w: acquire answered %v", errBadReply, r)
	}
	return g, nil
}

// Renew implements slots.Store in one round trip.
func (c *Concurrency) Renew(ctx context.Context, s slots.Slot, ttl time.Duration) (time.Time, error) {
	r, err := c.call(ctx, s, slotRenew, 0, 0, ttl.Milliseconds())
	if err != nil {
		return time.Time{}, err
	}
	if r[0] != 1 {
		return time.Time{}, slots.ErrLeaseNotFound
	}
	return time.UnixMilli(r[2]), nil
}

// Release implements slots.Store in one round trip.
func (c *Concurrency) Release(ctx context.Context, s slots.Slot) (bool, error) {
	r, err := c.call(ctx, s, slotRelease, 0, 0, 0)
	if err != nil {
		return false, err
	}
	return r[0] == 1, nil
}

// call runs slotset.lua's op on s's set: {ok, held, ms, now, reason}.
func (c *Concurrency) call(ctx context.Context, s slots.Slot, op int, limit, capacity, ttl int64) ([5]int64, error) {
	key := c.SetKey(s.Key, s.Scope)
	if c.pipe != nil {
		r, err := c.pipe.slot(ctx, key, s.Member, op, limit, capacity, ttl)
		if err != nil {
			return r, fmt.Errorf("slots %s %q: %w", slotOpNames[op], key, err)
		}
		return r, nil
	}
	var r [5]int64
	v, err := concurrencyScript.run(ctx, c.rdb, []string{key}, op, s.Member, limit, capacity, ttl).Int64Slice()
	if err != nil {
		return r, fmt.Errorf("slots %s %q: %w", slotOpNames[op], key, err)
	}
	if len(v) != len(r) {
		return r, fmt.Errorf("%w: slots %s answered %v", errBadReply, slotOpNames[op], v)
	}
	copy(r[:], v)
	return r, nil
}
