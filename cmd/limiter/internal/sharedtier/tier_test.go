package sharedtier

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/policy"
)

// Without Redis the tier is single-node mode: in-process, always ready.
func TestBuildSingleNode(t *testing.T) {
	tier, err := Build(context.Background(), Config{MaxKeys: 1000, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if tier.Kind != "memory" || tier.Reservations == nil || tier.Owner != nil {
		t.Fatalf("single-node tier: kind %q, reservations %v, owner set %v", tier.Kind, tier.Reservations, tier.Owner != nil)
	}
	v, err := tier.Take(context.Background(), "k", "s", enforcement.Limit{Rate: 1, Burst: 1}, 1)
	if err != nil || !v.Allowed {
		t.Fatalf("first take of a burst of 1: %+v, %v", v, err)
	}
	if r := tier.Ready(context.Background(), true, nil); r.Status != "ok" || r.Store != "memory" || r.Stores != nil {
		t.Errorf("single-node readiness %+v, want ok, memory, no stores", r)
	}
	store, run, _ := tier.ShadowChain(0, slog.New(slog.DiscardHandler))
	if store == nil || run == nil || store == tier.Authority {
		t.Error("single-node shadow store: want in-process buckets of its own")
	}
}

func TestStoresOfThePolicy(t *testing.T) {
	p, err := policy.Parse([]byte(`
version: 1
default_tier: std
tiers:
  std: { rate: 1, burst: 5 }
  dedicated: { rate: 1, burst: 5, store: acme }
keys:
  acct_big: { tier: std, store: big }
`))
	if err != nil {
		t.Fatal(err)
	}
	acme := []redisclient.NamedStore{{Name: "acme"}}
	if err := CheckStores(acme)(p); err == nil || !strings.Contains(err.Error(), "big") {
		t.Errorf("CheckStores with acme only: %v, want the store big refused", err)
	}
	if err := CheckStores(append(acme, redisclient.NamedStore{Name: "big"}))(p); err != nil {
		t.Errorf("CheckStores with both: %v", err)
	}
	if got := MissingStores(p, acme); !reflect.DeepEqual(got, []string{"big"}) {
		t.Errorf("MissingStores = %v, want [big]", got)
	}
}

// The limiter divides by the largest fleet count of its stores.
func TestFleetCountsLargest(t *testing.T) {
	var f fleetCounts
	for _, c := range []struct {
		store   string
		n, want int
	}{{"default", 3, 3}, {"acme", 5, 5}, {"acme", 2, 3}, {"default", 1, 2}} {
		if got := f.set(c.store, c.n); got != c.want {
			t.Errorf("set(%s, %d) = %d, want %d", c.store, c.n, got, c.want)
		}
	}
	if f.get("acme") != 2 || f.get("none") != 0 {
		t.Errorf("get: acme %d, none %d", f.get("acme"), f.get("none"))
	}
}

func TestReadyDegraded(t *testing.T) {
	states := map[string]redisstore.State{"b:6379": redisstore.HalfOpen, "a:6379": redisstore.Open, "c:6379": redisstore.Closed}
	diagnosed := 0
	tier := &Tier{Kind: redisclient.KindCluster, states: func() map[string]redisstore.State { return states },
		diagnose: func(context.Context) string { diagnosed++; return "connection refused" }}
	r := tier.Ready(context.Background(), false, nil)
	if r.Status != "degraded" || r.Breaker != "open" || r.Cause != "connection refused" ||
		!strings.Contains(r.Reason, "(a:6379, b:6379)") || diagnosed != 1 {
		t.Errorf("two shards not closed: %+v (diagnosed %d)", r, diagnosed)
	}
	states = map[string]redisstore.State{"a:6379": redisstore.Closed}
	if r := tier.Ready(context.Background(), false, nil); r.Status != "ok" || r.Breaker != "closed" || diagnosed != 1 {
		t.Errorf("closed breakers: %+v (diagnosed %d: only while degraded)", r, diagnosed)
	}
	if r := tier.Ready(context.Background(), true, nil); r.Status != "degraded" || !strings.Contains(r.Reason, "latest decision") {
		t.Errorf("the limiter's latest decision failed: %+v", r)
	}
	tier.failing = func() bool { return true }
	if r := tier.Ready(context.Background(), false, nil); r.Status != "degraded" || !strings.Contains(r.Reason, "heartbeat") {
		t.Errorf("the heartbeat fails: %+v", r)
	}
}
