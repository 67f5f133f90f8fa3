package sharedtier

import (
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
)

// SupportStore is one shared store as the support tools use it
// (docs/support.md): its scripts, its key prefix and its client, on which
// resets are announced.
type SupportStore struct {
	Name   string // limits.DefaultStore, or REDIS_STORES's name
	Prefix string
	Store  *redisstore.Store
	Client redis.UniversalClient
}

// SupportStores are the tier's stores, the default one first; none in
// single-node mode.
func (t *Tier) SupportStores() []SupportStore {
	var out []SupportStore
	for _, h := range t.stores {
		prefix := t.cfg.Redis.KeyPrefix
		for _, ns := range t.cfg.Stores {
			if ns.Name == h.name {
				prefix = ns.Redis.KeyPrefix
			}
		}
		if prefix == "" {
			prefix = limits.DefaultKeyPrefix
		}
		out = append(out, SupportStore{Name: h.name, Prefix: prefix, Store: h.shared.Store(), Client: h.conn.UniversalClient})
	}
	return out
}

// LeaseHeld is what this instance holds leased of (key, scope)'s bucket;
// false when leasing is off (LIMITER_LEASE_BLOCK unset) or the key was
// never leased here.
func (t *Tier) LeaseHeld(key, scope string) (lease.Held, bool) {
	if t.lease == nil {
		return lease.Held{}, false
	}
	return t.lease.Held(key, scope)
}
