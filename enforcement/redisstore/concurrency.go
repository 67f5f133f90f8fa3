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

//go:embed concurrency.lua
var concurrencyLua string

// concurrencyScript is every slot operation (acquire, renew, release), one
// atomic call each. An acquire is safe to send twice (the same member
// holds one slot), but it goes through the spend path like every script
// that changes what a key may do (spend.go).
var concurrencyScript = newSpendScript(concurrencyLua)

// Concurrency is the fleet's slots of concurrency limits in Redis or Redis
// Cluster (slots.Store): one sorted set per (key, scope), under the key's
// hash tag (keyslot.SlotSetKey), so each call touches one Cluster slot.
// It is safe for concurrent use.
type Concurrency struct {
	rdb    redis.Scripter
	prefix string
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
	r, err := c.call(ctx, s, "acquire", limit, capacity, ttl.Milliseconds())
	if err != nil {
		return slots.Grant{}, err
	}
	g := slots.Grant{Admitted: r[0] == 1, Held: r[1], Now: time.UnixMilli(r[3])}
	if g.Admitted {
		g.ExpiresAt = time.UnixMilli(r[2])
		return g, nil
	}
	if len(r) < 5 {
		return slots.Grant{}, fmt.Errorf("%w: acquire answered %v", errBadReply, r)
	}
	g.RetryAfter = time.Duration(max(1, r[2])) * time.Millisecond
	g.Reason = enforcement.ReasonShed
	if r[4] == 1 {
		g.Reason = enforcement.ReasonConcurrency
	}
	return g, nil
}

// Renew implements slots.Store in one round trip.
func (c *Concurrency) Renew(ctx context.Context, s slots.Slot, ttl time.Duration) (time.Time, error) {
	r, err := c.call(ctx, s, "renew", ttl.Milliseconds())
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
	r, err := c.call(ctx, s, "release")
	if err != nil {
		return false, err
	}
	return r[0] == 1, nil
}

func (c *Concurrency) call(ctx context.Context, s slots.Slot, op string, args ...any) ([]int64, error) {
	key := c.SetKey(s.Key, s.Scope)
	r, err := concurrencyScript.run(ctx, c.rdb, []string{key}, append([]any{op, s.Member}, args...)...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("slots %s %q: %w", op, key, err)
	}
	if len(r) < 4 {
		return nil, fmt.Errorf("%w: slots %s answered %v", errBadReply, op, r)
	}
	return r, nil
}
