// Package shardguard gives every Redis Cluster shard its own deadline and
// circuit breaker (guard.Authority). With one breaker for the whole store,
// a dead master fails every third decision, five failures in a row open the
// breaker, and then every key decides degraded although two thirds of the
// slots are healthy. Behind shardguard, losing one master degrades only the
// keys whose slots it held.
package shardguard

import (
	"context"
	"log/slog"
	"sync"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/guard"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
)

// Authority routes each decision through the guard of the shard that owns
// the key's hash slot. It is safe for concurrent use.
type Authority struct {
	next     enforcement.Authority
	owner    func(slot uint16) string
	slotOf   func(key, scope string) uint16
	settings guard.Settings
	obs      guard.Observer
	log      *slog.Logger

	mu     sync.RWMutex
	guards map[string]*guard.Authority
}

var _ enforcement.Authority = (*Authority)(nil)

// New wraps next (normally a *redisstore.Store on a cluster client). owner
// names the shard of a slot (redisstore.SlotMap.Owner); slotOf is the slot
// of a bucket (nil = keyslot.KeySlot, redisstore's layout). s, obs and log
// configure every shard's guard as guard.New does.
func New(next enforcement.Authority, owner func(slot uint16) string, slotOf func(key, scope string) uint16,
	s guard.Settings, obs guard.Observer, log *slog.Logger) *Authority {
	if slotOf == nil {
		slotOf = keyslot.KeySlot
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Authority{next: next, owner: owner, slotOf: slotOf, settings: s, obs: obs, log: log,
		guards: make(map[string]*guard.Authority)}
}

func (a *Authority) guardOf(shard string) *guard.Authority {
	a.mu.RLock()
	g := a.guards[shard]
	a.mu.RUnlock()
	if g != nil {
		return g
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if g = a.guards[shard]; g == nil {
		obs := a.obs
		if per, ok := obs.(interface{ ForShard(string) guard.Observer }); ok {
			obs = per.ForShard(shard) // a breaker state per shard, not one for all
		}
		g = guard.New(a.next, a.settings, obs, a.log.With("shard", shard))
		a.guards[shard] = g
	}
	return g
}

// Take implements enforcement.Authority.
func (a *Authority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	return a.guardOf(a.owner(a.slotOf(key, scope))).Take(ctx, key, scope, lim, cost)
}

// Do runs fn, a store call about the bucket of (key, scope) (a lease, a
// return), under the deadline and breaker of the shard that owns the key's
// slot: the same ones its decisions pass (guard.Authority.Do).
func (a *Authority) Do(ctx context.Context, key, scope string, fn func(ctx context.Context) error) error {
	return a.guardOf(a.owner(a.slotOf(key, scope))).Do(ctx, fn)
}

// States reports every shard's breaker state.
func (a *Authority) States() map[string]guard.State {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make(map[string]guard.State, len(a.guards))
	for s, g := range a.guards {
		out[s] = g.State()
	}
	return out
}

// Guard returns the guard of the shard that owns slot, for store calls
// other than decisions (leases, heartbeats): they pass the same deadline
// and breaker.
func (a *Authority) Guard(slot uint16) *guard.Authority { return a.guardOf(a.owner(slot)) }
