package redisstore

// Design: Shared is the whole shared store as the limiter consumes it
// (enforcement.Store): decisions go through the auto-pipeline (Pipelined),
// leases, returns and fleet heartbeats through the plain scripts (Store),
// and every call, whatever its purpose, through the Guard of the shard that
// owns its key. Over one server there is one shard, "store". Over a
// Cluster there is one per master, named by its address from the slot map:
// with one breaker for the whole store, a dead master fails every third
// decision, five failures in a row open the breaker, and then every key
// decides degraded although two thirds of the slots are healthy; with one
// per master, losing one degrades only the keys whose slots it held.
//
// The guards of one store share one starvation monitor (lag.go). Run owns
// the background work: the monitor's probe, the Cluster's slot refresher,
// and the pipeline's connections.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
)

// SharedConfig configures a Shared store. The zero value of each field is
// its documented default.
type SharedConfig struct {
	// Prefix starts every key ("rl" when empty).
	Prefix string
	// Pipeline tunes the decisions' auto-pipelining.
	Pipeline PipelineConfig
	// Guard sets each shard's deadline and breaker.
	Guard GuardSettings
	// Observer, optional, sees every store call and breaker state; over a
	// Cluster, one with a ForShard(shard string) Observer method gets one
	// observer per shard (a breaker state per shard, not one for all).
	Observer Observer
	// Log receives breaker transitions and slot-refresh failures
	// (default: discarded).
	Log *slog.Logger
	// SlotRefresh is how often Run re-reads a Cluster's slots (default
	// 10s; every second until the first read succeeds).
	SlotRefresh time.Duration
}

// Shared is an enforcement.Store on Redis or Redis Cluster, with a deadline
// and a circuit breaker per shard. It is safe for concurrent use; its
// methods work from NewShared on, and Run does its background work.
type Shared struct {
	next     enforcement.Authority // the decisions' path: pipe, or a test's
	pipe     *Pipelined
	store    *Store
	slots    *SlotMap // nil over one server
	owner    func(slot uint16) string
	settings GuardSettings
	obs      Observer
	log      *slog.Logger
	lag      *lagMonitor
	refresh  time.Duration
	single   *Guard // over one server: the one shard's guard

	mu     sync.RWMutex
	guards map[string]*Guard

	// seq orders store calls' outcomes: failing while the latest failure
	// is later than the latest success.
	seq, lastOK, lastFail atomic.Uint64
}

var _ enforcement.Store = (*Shared)(nil)

// oneShard names the shard of a store on one server.
const oneShard = "store"

// NewShared returns the shared store over rdb (a *redis.Client:
// standalone or Sentinel, or a *redis.ClusterClient). It makes no network
// call; Preload loads the scripts and the slot map at start.
func NewShared(rdb PipelineClient, cfg SharedConfig) *Shared {
	if cfg.SlotRefresh <= 0 {
		cfg.SlotRefresh = 10 * time.Second
	}
	pipe := NewPipelined(rdb, cfg.Prefix, cfg.Pipeline)
	s := newShared(pipe, cfg.Guard, cfg.Observer, cfg.Log)
	s.pipe, s.store, s.refresh = pipe, pipe.Store(), cfg.SlotRefresh
	if cluster, ok := rdb.(*redis.ClusterClient); ok {
		s.slots = &SlotMap{rdb: cluster}
		s.slots.owners.Store(new([16384]string))
		s.owner = s.slots.Owner
	} else {
		s.single = s.guardOf(oneShard)
	}
	return s
}

// newShared is the guarding half of a Shared: decisions go to next, every
// shard "store" until owner is set.
func newShared(next enforcement.Authority, settings GuardSettings, obs Observer, log *slog.Logger) *Shared {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Shared{settings: settings, obs: obs, log: log, lag: newLagMonitor(lagTick, lagSlack, lagHistory),
		next: next, guards: make(map[string]*Guard), owner: func(uint16) string { return oneShard }}
	return s
}

// Preload loads the scripts into every reachable server and, over a
// Cluster, the slot map, so that the first decisions neither pay for a
// NOSCRIPT round trip nor decide as one shard. A failure is not fatal: the
// store answers degraded until Redis does, and Run keeps reading the slots.
func (s *Shared) Preload(ctx context.Context) error {
	var errs []error
	if s.slots != nil {
		errs = append(errs, s.slots.Refresh(ctx))
	}
	errs = append(errs, s.store.Preload(ctx))
	return errors.Join(errs...)
}

// Run does the store's background work until ctx ends: the guards'
// starvation monitor, the pipeline's connections and, over a Cluster, the
// slot refresher. Decisions are answered while it runs; when ctx ends,
// those queued or in flight get ErrClosed, and Run returns once every
// goroutine it started has returned.
func (s *Shared) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.lag.run(ctx) }()
	if s.slots != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failing := !s.slots.loaded.Load()
			s.slots.Run(ctx, s.refresh, func(err error) {
				if !failing { // once per outage, not once a second
					s.log.Warn("refresh cluster slots", "err", err)
				}
				failing = true
			})
		}()
	}
	if s.pipe != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.pipe.Run(ctx) }()
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// guardOf is the guard of shard, made on first use.
func (s *Shared) guardOf(shard string) *Guard {
	s.mu.RLock()
	g := s.guards[shard]
	s.mu.RUnlock()
	if g != nil {
		return g
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if g = s.guards[shard]; g == nil {
		obs := s.obs
		if per, ok := obs.(interface{ ForShard(string) Observer }); ok && shard != oneShard {
			obs = per.ForShard(shard)
		}
		g = newGuard(s.next, s.settings, outcomes{s, obs}, s.log.With("shard", shard), s.lag)
		s.guards[shard] = g
	}
	return g
}

// guardFor is the guard of the shard that owns slot.
func (s *Shared) guardFor(slot uint16) *Guard {
	if s.single != nil {
		return s.single
	}
	return s.guardOf(s.owner(slot))
}

// Take implements enforcement.Authority.
func (s *Shared) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	if g := s.single; g != nil { // one server: no slot to compute
		return g.Take(ctx, key, scope, lim, cost)
	}
	return s.guardOf(s.owner(keyslot.KeySlot(key, scope))).Take(ctx, key, scope, lim, cost)
}

// do runs fn, a store call about the bucket of (key, scope) (a lease, a
// return), under the deadline and breaker of the shard that owns the key's
// slot: the same ones its decisions pass (Guard.Do).
func (s *Shared) do(ctx context.Context, key, scope string, fn func(ctx context.Context) error) error {
	return s.guardFor(keyslot.KeySlot(key, scope)).Do(ctx, fn)
}

// Each call below hands fn its own result variables and reads them only
// when Do succeeded: Do may give up on a late call and return while fn is
// still running, and fn's late write must then touch nothing the caller
// reads.

// Lease implements enforcement.Store (Store.Lease under the key's guard).
func (s *Shared) Lease(ctx context.Context, key, scope string, lim enforcement.Limit, need, want int64) (enforcement.Grant, error) {
	var grant enforcement.Grant
	err := s.do(ctx, key, scope, func(ctx context.Context) error {
		var err error
		grant, err = s.store.Lease(ctx, key, scope, lim, need, want)
		return err
	})
	if err != nil {
		return enforcement.Grant{}, err
	}
	return grant, nil
}

// Return implements enforcement.Store (Store.Return under the key's guard).
func (s *Shared) Return(ctx context.Context, key, scope string, lim enforcement.Limit, n int64) (enforcement.Grant, error) {
	var grant enforcement.Grant
	err := s.do(ctx, key, scope, func(ctx context.Context) error {
		var err error
		grant, err = s.store.Return(ctx, key, scope, lim, n)
		return err
	})
	if err != nil {
		return enforcement.Grant{}, err
	}
	return grant, nil
}

// Beat implements enforcement.Store (Store.Beat under the fleet key's guard).
func (s *Shared) Beat(ctx context.Context, member string, ttl time.Duration) (int, error) {
	return s.fleet(ctx, func(ctx context.Context) (int, error) { return s.store.Beat(ctx, member, ttl) })
}

// Leave implements enforcement.Store (Store.Leave under the fleet key's guard).
func (s *Shared) Leave(ctx context.Context, member string, ttl time.Duration) (int, error) {
	return s.fleet(ctx, func(ctx context.Context) (int, error) { return s.store.Leave(ctx, member, ttl) })
}

func (s *Shared) fleet(ctx context.Context, call func(context.Context) (int, error)) (int, error) {
	var n int
	err := s.guardFor(keyslot.Slot(s.store.FleetKey())).Do(ctx, func(ctx context.Context) error {
		var err error
		n, err = call(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Store is the plain store with the same key layout (BucketKey, QuotaKey).
func (s *Shared) Store() *Store { return s.store }

// Concurrency is the slot store on the same servers and key prefix, whose
// calls ride the decisions' auto-pipeline.
func (s *Shared) Concurrency() *Concurrency {
	if s.pipe == nil {
		return s.store.Concurrency()
	}
	return s.pipe.Concurrency()
}

// Owner names the shard that owns slot: a Cluster master's address
// ("unassigned" before the slot map is read), or "store" over one server.
func (s *Shared) Owner(slot uint16) string {
	if s.single != nil {
		return oneShard
	}
	return s.owner(slot)
}

// States reports the breaker state of every shard: over a Cluster only the
// masters that own slots now (a guard left behind by a failover, or the
// "unassigned" one of a start before the cluster, says nothing of the
// store any more).
func (s *Shared) States() map[string]State {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]State, len(s.guards))
	var live map[string]bool
	if s.slots != nil {
		live = s.slots.Masters()
	}
	for shard, g := range s.guards {
		if live == nil || live[shard] {
			out[shard] = g.State()
		}
	}
	if s.single != nil {
		out[oneShard] = s.single.State()
	}
	return out
}

// Failing reports whether the store's latest call failed (no call has
// succeeded since), whatever its purpose: a decision, a lease or a fleet
// heartbeat. It sees trouble the breakers have not (yet): one failed call,
// or heartbeats failing while traffic is too light to trip them. A caller
// that gave up is not a failure.
func (s *Shared) Failing() bool { return s.lastFail.Load() > s.lastOK.Load() }

// outcomes records every guarded call's outcome for Failing, then passes
// it on.
type outcomes struct {
	s    *Shared
	next Observer // may be nil
}

func (o outcomes) StoreCall(took time.Duration, err error) {
	s := o.s
	if err != nil {
		s.lastFail.Store(s.seq.Add(1))
	} else if s.lastFail.Load() > s.lastOK.Load() {
		// Written only after a failure: a write per call would bounce one
		// cache line between every core deciding.
		s.lastOK.Store(s.seq.Add(1))
	}
	if o.next != nil {
		o.next.StoreCall(took, err)
	}
}

func (o outcomes) BreakerState(st State) {
	if o.next != nil {
		o.next.BreakerState(st)
	}
}
