// Package sharedtier builds the limiter's decision path below the local
// tier from its configuration: the shared stores (the default one and
// REDIS_STORES's), each with its client, script pipeline, deadline and
// breaker; the decorators in front of them; the fleet heartbeat of each
// store; and what /readyz says of them. Path (path.go) is the one place
// that states the order of the whole decision path and joins it; chain
// stacks each chain below the local tier.
package sharedtier

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/fleet"
	"github.com/ratewarden/ratewarden/enforcement/keyname"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
)

// Config is the shared tier's part of the limiter's configuration.
type Config struct {
	// Redis is the default store (REDIS_*); not Enabled = single-node
	// mode, an in-process authority bounded by MaxKeys and MaxBytes.
	Redis  redisclient.Config
	Stores []redisclient.NamedStore // REDIS_STORES, sorted by name

	StoreTimeout    time.Duration // LIMITER_STORE_TIMEOUT: one decision's deadline at the store
	StoreInFlight   int           // LIMITER_STORE_BATCHES_IN_FLIGHT; 0 = redisstore's default
	BreakerFailures int           // LIMITER_BREAKER_FAILURES
	BreakerOpenFor  time.Duration // LIMITER_BREAKER_OPEN_FOR

	MaxKeys  int   // single-node mode's bound on keys
	MaxBytes int64 // and on bytes; 0 = enforcement's default

	LeaseBlock   int           // LIMITER_LEASE_BLOCK; 0 = leasing off
	LeaseHotOps  float64       // LIMITER_LEASE_HOT_OPS
	LeaseMaxHold time.Duration // LIMITER_LEASE_MAX_HOLD
	KeyNames     keyname.Namer // how the leases' logs name keys

	// Metrics receive the default store's calls; nil = none.
	Metrics *limitmetrics.Metrics
	Log     *slog.Logger
}

// Tier is the shared tier as built, an enforcement.Authority, with the
// components that run it (Add, AddFleet).
type Tier struct {
	enforcement.Authority
	// Kind is memory, redis, redis-cluster or redis-sentinel.
	Kind string
	// Owner is the shard of a hash slot (hot-key visibility); nil = one
	// server.
	Owner func(slot uint16) string
	// Reservations keeps reservations (reserve, settle, charge): the store
	// routing itself, unwrapped, or single-node mode's authority.
	Reservations enforcement.Reserver
	// Peeker answers peeks (POST /check "peek"): split over the stores,
	// reading the buckets the decisions spend without writing.
	Peeker enforcement.Peeker

	states   func() map[string]redisstore.State // breaker per shard; nil in memory mode
	diagnose func(ctx context.Context) string   // why Redis does not answer; nil in memory mode
	// failing reports store trouble the breakers have not (yet) seen: the
	// fleet heartbeat failing while traffic is too light to trip them.
	failing func() bool

	lease  *lease.Authority // nil when leasing is off
	stages []string         // the chain's stage names, from the top (chain)
	stores []*storeHandle   // the default store first, then REDIS_STORES's in name order
	fleet  fleetCounts
	rdb    redis.UniversalClient        // the default store's client; nil in single-node mode
	mem    *enforcement.MemoryAuthority // single-node mode's authority; nil with Redis
	cfg    Config
}

// Build assembles the shared tier, the chain below the local tier (Path
// states the whole order): with Redis, lease → split → store → guard →
// pipeline, where the store is enforcement.Stores over one
// redisstore.Shared per store (the default one and REDIS_STORES's), each
// holding a guard per shard and a pipeline per server; lease only when
// LIMITER_LEASE_BLOCK is set. Without Redis it is split over an
// in-process authority (single-node mode). A store that does not answer at start is not an error: the
// limiter serves degraded until it does. The clients opened are closed by
// the group Add registers them with, or here when Build fails.
func Build(ctx context.Context, cfg Config) (*Tier, error) {
	log := cfg.Log
	if !cfg.Redis.Enabled() {
		log.Warn("REDIS_ADDRS is empty: single-node mode, decisions are correct for ONE limiter instance only")
		mem := MemoryAuthority(cfg.MaxKeys, cfg.MaxBytes)
		b := chain(chainSpec{bottom: mem, stages: []string{"store"}, split: true})
		return &Tier{Authority: b.auth, Peeker: b.peek, Kind: "memory", mem: mem, Reservations: split.NewReserver(mem), stages: b.stages, cfg: cfg}, nil
	}
	// shared → guard → lane, one per store, each reached as configured
	// (internal/redisclient: standalone, Cluster or Sentinel, TLS, ACL).
	def, err := openStore(ctx, limits.DefaultStore, cfg.Redis, cfg, cfg.Metrics, log)
	if err != nil {
		return nil, err
	}
	t := &Tier{Kind: def.kind, diagnose: def.conn.Diagnose, states: def.shared.States,
		rdb: def.conn.UniversalClient, stores: []*storeHandle{def}, cfg: cfg}
	if t.Kind == redisclient.KindCluster {
		t.Owner = def.shared.Owner
	}
	for _, ns := range cfg.Stores {
		h, err := openStore(ctx, ns.Name, ns.Redis, cfg, nil, log)
		if err != nil {
			t.closeClients()
			return nil, err
		}
		t.stores = append(t.stores, h)
	}
	// stores: the store the key's limit names.
	routed := enforcement.NewStores(def.shared, namedStores(t.stores[1:]))
	t.Reservations = split.NewReserver(routed) // split keys reserve on their sub-buckets
	// split over the routing; lease outermost, over split, its blocks
	// taken from the routing.
	spec := chainSpec{bottom: routed, stages: []string{"store", "guard", "pipeline"}, split: true, leaseStore: routed}
	if cfg.LeaseBlock > 0 {
		spec.lease = &lease.Config{
			Block:        int64(cfg.LeaseBlock),
			HotOpsPerSec: cfg.LeaseHotOps,
			MaxHold:      cfg.LeaseMaxHold,
			// The store's guard judges lateness (and tells a starved
			// process from a slow store); this is only the outer bound
			// of a lease call.
			Timeout: time.Second,
			Log:     log,
			Names:   cfg.KeyNames,
		}
	}
	b := chain(spec)
	t.Authority, t.lease, t.Peeker, t.stages = b.auth, b.lease, b.peek, b.stages
	return t, nil
}

// SlotStores is each store's concurrency slots (enforcement/slots): the
// default store's and REDIS_STORES's by name, on the same servers, key
// prefixes and auto-pipelines as their buckets; in single-node mode one
// in-process set.
func (t *Tier) SlotStores() (def slots.Store, named map[string]slots.Store) {
	if t.mem != nil {
		return slots.NewMemory(nil), nil
	}
	named = make(map[string]slots.Store, len(t.stores)-1)
	for _, h := range t.stores[1:] {
		named[h.name] = h.shared.Concurrency()
	}
	return t.stores[0].shared.Concurrency(), named
}

// Add registers what runs the tier: each store (its client closed after
// it), then the leases, which go back before the stores stop.
func (t *Tier) Add(g *lifecycle.Group) {
	if t.mem != nil {
		g.Add("memory sweeper", t.mem.Run)
	}
	for _, h := range t.stores {
		h.add(g)
	}
	if t.lease != nil {
		g.Add("leases", t.lease.Run) // returns held tokens while Redis is still open
	}
}

// closeClients closes the stores' clients opened so far when Build fails
// part way (after it, the group closes them).
func (t *Tier) closeClients() {
	for _, h := range t.stores {
		_ = h.conn.Close()
	}
}

// Clients calls fn for each store's client with what names it ("redis",
// "redis:NAME") and its Reload (the password and TLS files re-read, on
// SIGHUP).
func (t *Tier) Clients(fn func(what string, reload func() error)) {
	for _, h := range t.stores {
		what := "redis"
		if h.name != limits.DefaultStore {
			what = "redis:" + h.name
		}
		fn(what, h.conn.Reload)
	}
}

// Instances is what the fleet heartbeats tell: the limiter's live count
// (enforcement.Limiter).
type Instances interface {
	SetInstances(n int) // never below LIMITER_EXPECTED_INSTANCES
	Instances() int
}

// FleetConfig is the fleet heartbeat's part of the configuration.
type FleetConfig struct {
	Member string        // LIMITER_INSTANCE_ID
	Every  time.Duration // LIMITER_FLEET_HEARTBEAT
}

// AddFleet adds a fleet heartbeat per shared store: the live instance
// count (never below LIMITER_EXPECTED_INSTANCES) is what the limiter's
// local tier, degraded limits and quota share divide by, and what the
// hot-key threshold is shared over; with several stores, the largest
// count. Each leaves its fleet when stopped. Nothing in single-node mode.
func (t *Tier) AddFleet(g *lifecycle.Group, cfg FleetConfig, lim Instances, metrics *limitmetrics.Metrics) error {
	metrics.Instances(lim.Instances())
	for _, h := range t.stores {
		hlog := t.cfg.Log
		if h.name != limits.DefaultStore {
			hlog = hlog.With("store", h.name)
		}
		hb, err := fleet.New(h.shared, fleet.Config{
			Member: cfg.Member,
			Every:  cfg.Every,
			Log:    hlog,
			OnCount: func(n int) {
				lim.SetInstances(t.fleet.set(h.name, n))
				n = lim.Instances()
				if t.lease != nil {
					t.lease.SetInstances(n)
				}
				metrics.Instances(n)
			},
		})
		if err != nil {
			return err
		}
		h.hb = hb
		g.Add("fleet heartbeat "+h.name, hb.Run)
		if h.name == limits.DefaultStore {
			t.failing = hb.Failing
		}
	}
	return nil
}

// guard is the deadline and breaker of a store call with deadline
// timeout. Every breaker the limiter builds takes LIMITER_BREAKER_FAILURES
// and LIMITER_BREAKER_OPEN_FOR from here (the global decisions' too:
// BuildRegion).
func (c Config) guard(timeout time.Duration) redisstore.GuardSettings {
	return redisstore.GuardSettings{
		Timeout:             timeout,
		StarvedGrace:        redisstore.DefaultStarvedGrace,
		ConsecutiveFailures: uint32(c.BreakerFailures),
		OpenFor:             c.BreakerOpenFor,
	}
}

// GlobalDeadline is the deadline of a global decision's call to the
// region's Redis (docs/regions.md): the store timeout plus the room a
// regional call has on a machine short of CPU. A global decision is one
// script call with a plain deadline, so the room is given outright rather
// than only while the process is starved.
func GlobalDeadline(storeTimeout time.Duration) time.Duration {
	g := (Config{}).guard(storeTimeout)
	return g.Timeout + g.StarvedGrace
}

// MemoryAuthority is the in-process authority of single-node mode,
// bounded as the local tier is (LIMITER_MAX_KEYS and
// LIMITER_LOCAL_MAX_BYTES, a bound of its own); its Run sweeps.
func MemoryAuthority(maxKeys int, maxBytes int64) *enforcement.MemoryAuthority {
	return enforcement.NewMemoryAuthorityBytes(nil, maxKeys, maxBytes)
}

// ShadowKeyPrefix is the Redis namespace of shadow buckets and quota
// counters: `rl:shadow:{key}:b2:scope` can never be an enforced key, whose
// layout is `rl:{key}:...` (the reconciler, which restores quota counters
// under `rl:{`, never touches them either). The rate-limit key stays the
// hash tag, so a shadow bucket lives in its enforced twin's Cluster slot.
func ShadowKeyPrefix(prefix string) string { return prefix + ":shadow" }

// Stages are the chain's stage names from the top (Order's, from lease
// on).
func (t *Tier) Stages() []string { return t.stages }

// ShadowChain is the shadow tier's chain, split over its store, built by
// the same code as the enforced one (chain), with what runs the store and
// the chain's stage names. The store is on the default store's client, in
// its own key namespace, with its own deadline and breaker (a slow shadow
// never opens the enforced breaker); in single-node mode, in-process
// buckets of its own. Run it after the tier's stores (Add): it stops
// before the client it shares closes.
func (t *Tier) ShadowChain(timeout time.Duration, log *slog.Logger) (enforcement.Authority, func(context.Context) error, []string) {
	if t.rdb == nil {
		mem := MemoryAuthority(t.cfg.MaxKeys, t.cfg.MaxBytes)
		b := chain(chainSpec{bottom: mem, stages: []string{"store"}, split: true})
		return b.auth, mem.Run, b.stages
	}
	shared := redisstore.NewShared(t.rdb, redisstore.SharedConfig{
		Prefix:   ShadowKeyPrefix(t.cfg.Redis.KeyPrefix),
		Pipeline: redisstore.PipelineConfig{Timeout: timeout},
		Guard:    t.cfg.guard(timeout),
		Log:      log,
	})
	b := chain(chainSpec{bottom: shared, stages: []string{"store", "guard", "pipeline"}, split: true})
	return b.auth, shared.Run, b.stages
}
