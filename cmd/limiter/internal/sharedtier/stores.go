package sharedtier

// Dedicated capacity: REDIS_STORES names stores beside the default one
// (REDIS_ADDRS), and the policy routes keys to them (a key's entry
// `{ tier: T, store: NAME }`, or a tier's `store:`). Each store is its own
// redisstore.Shared — its own client, deadline and breaker per shard,
// fleet heartbeat and readiness entry — so a store that is down degrades
// only the keys routed to it. Adding a store is configuration.

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/fleet"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
)

// CheckStores refuses a policy that routes keys to a store not configured.
func CheckStores(stores []redisclient.NamedStore) func(p *policy.Policy) error {
	return func(p *policy.Policy) error {
		return p.CheckStores(func(name string) bool {
			for _, s := range stores {
				if s.Name == name {
					return true
				}
			}
			return false
		})
	}
}

// MissingStores lists the stores the policy in force routes keys to (its
// document's and its overrides' routing) that this limiter lacks. In file
// mode such a policy is refused (CheckStores); the policy log's apply rule
// cannot depend on one limiter's REDIS_STORES, so in log mode the revision
// applies here too and the keys routed to a missing store decide degraded,
// as if that store were down (enforcement.ErrUnknownStore).
func MissingStores(p enforcement.Policy, configured []redisclient.NamedStore) []string {
	r, ok := p.(interface{ Stores() []string })
	if !ok {
		return nil
	}
	var out []string
	for _, name := range r.Stores() {
		found := false
		for _, s := range configured {
			found = found || s.Name == name
		}
		if !found {
			out = append(out, name)
		}
	}
	return out
}

// storeHandle is one built store, default or named.
type storeHandle struct {
	name   string // limits.DefaultStore for REDIS_ADDRS's
	kind   string
	shared *redisstore.Shared
	conn   *redisclient.Client
	hb     *fleet.Heartbeat // nil until AddFleet
}

// openStore connects one store and loads its scripts; add runs it.
func openStore(ctx context.Context, name string, rc redisclient.Config, cfg Config, metrics *limitmetrics.Metrics, log *slog.Logger) (*storeHandle, error) {
	conn, err := rc.Open(redisclient.Options{Timeout: time.Second, MaxRetries: -1, PoolSize: 64, MinIdleConns: 8})
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", name, err)
	}
	if name != limits.DefaultStore {
		log = log.With("store", name)
	}
	var obs redisstore.Observer
	if metrics != nil && name == limits.DefaultStore {
		obs = metrics // the store metrics are the default store's, as before
	}
	shared := redisstore.NewShared(conn.UniversalClient, redisstore.SharedConfig{
		Prefix: rc.KeyPrefix,
		// A pipeline never outlives a decision's deadline: a worker stuck
		// on a dead Cluster master must not hold up the decisions of live ones.
		Pipeline: redisstore.PipelineConfig{Timeout: cfg.StoreTimeout, Workers: cfg.StoreInFlight},
		Guard:    cfg.guard(cfg.StoreTimeout),
		Observer: obs,
		Log:      log,
	})
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := shared.Preload(pctx); err != nil {
		// Not fatal: the limiter serves degraded and recovers when Redis
		// does; a Cluster's slots are read again every second until then.
		log.Warn("could not load the scripts or the cluster's slots at start; serving degraded until Redis answers", "err", err)
	}
	return &storeHandle{name: name, kind: conn.Kind(), shared: shared, conn: conn}, nil
}

// add runs the store (its pipeline, guards and slot refresher); its
// client closes after Run has returned.
func (h *storeHandle) add(g *lifecycle.Group) {
	g.OnStop("redis client "+h.name, func(context.Context) error { return h.conn.Close() })
	g.Add("store "+h.name, h.shared.Run)
}

// fleetCounts keeps each store's fleet count; the limiter divides by the
// largest (a store that is down keeps its last count, as a lone store does).
type fleetCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *fleetCounts) set(store string, n int) (largest int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[store] = n
	for _, c := range f.n {
		largest = max(largest, c)
	}
	return largest
}

func (f *fleetCounts) get(store string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[store]
}

// StoreReady is one store's entry in /readyz's "stores".
type StoreReady struct {
	Status    string            `json:"status"` // ok | degraded
	Store     string            `json:"store"`  // redis | redis-cluster | redis-sentinel
	Breaker   string            `json:"breaker"`
	Shards    map[string]string `json:"shards,omitempty"` // a Cluster's masters' breakers
	Instances int               `json:"instances,omitempty"`
	Reason    string            `json:"reason,omitempty"`
}

// readyOf is the readiness of one store.
func readyOf(h *storeHandle, instances int) StoreReady {
	r := StoreReady{Status: "ok", Store: h.kind, Instances: instances}
	states := h.shared.States()
	var down []string
	r.Breaker, down = breakerOf(states)
	if h.kind == redisclient.KindCluster {
		r.Shards = map[string]string{}
		for shard, st := range states {
			r.Shards[shard] = breakerName(st)
		}
	}
	switch {
	case len(down) > 0:
		r.Status = "degraded"
		r.Reason = "unavailable (" + strings.Join(down, ", ") + "): its keys decide with tightened local limits"
	case h.shared.Failing():
		r.Status = "degraded"
		r.Reason = "the latest call failed: its keys decide with tightened local limits"
	case h.hb != nil && h.hb.Failing():
		r.Status = "degraded"
		r.Reason = "the fleet heartbeat cannot reach it"
	}
	return r
}

// breakerOf is a store's breaker as /readyz reports it: "open" when a
// shard's is, else "half-open" when one is, else "closed"; down names the
// shards not closed, sorted.
func breakerOf(states map[string]redisstore.State) (breaker string, down []string) {
	breaker = "closed"
	for shard, st := range states {
		switch st {
		case redisstore.Open:
			breaker = "open"
		case redisstore.HalfOpen:
			if breaker != "open" {
				breaker = "half-open"
			}
		default:
			continue
		}
		down = append(down, shard)
	}
	sort.Strings(down)
	return breaker, down
}

func breakerName(st redisstore.State) string {
	switch st {
	case redisstore.Open:
		return "open"
	case redisstore.HalfOpen:
		return "half-open"
	}
	return "closed"
}

// namedStores maps the named handles for enforcement.NewStores.
func namedStores(hs []*storeHandle) map[string]enforcement.Store {
	out := map[string]enforcement.Store{}
	for _, h := range hs {
		out[h.name] = h.shared
	}
	return out
}
