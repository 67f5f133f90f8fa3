package main

// The support tools on the limiter (docs/support.md): GET
// /admin/keys/local (this limiter's view of one key, which `limiter key
// inspect` asks of every limiter), GET /admin/keys/inspect (the whole
// inspect, read from here), POST /admin/keys/reset (a signed reset), and
// the listener that drops the local view of every key a reset is
// announced for. This file only reads their configuration and wires them
// (support).

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/sharedtier"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/support"
)

// supportConfig is what the support API reads beyond the limiter's own
// variables.
type supportConfig struct {
	FleetURLs []string // LIMITER_FLEET_URLS: the limiters inspect asks
	// ClickHouse is CLICKHOUSE_* when CLICKHOUSE_ADDR is set (the recorded
	// decisions); nil = inspect marks them not configured.
	ClickHouse *chconn.Config
}

func supportConfigFrom(e *envconfig.Reader) supportConfig {
	c := supportConfig{FleetURLs: e.List("LIMITER_FLEET_URLS")}
	if e.Raw("CLICKHOUSE_ADDR") != "" {
		ch := chconn.FromEnv(e, schema.ValidDatabase)
		c.ClickHouse = &ch
	}
	return c
}

// openClickHouse opens the pool inspect reads decisions with (nothing
// when not configured).
func openClickHouse(c *chconn.Config, g *lifecycle.Group) (driver.Conn, string) {
	if c == nil {
		return nil, ""
	}
	conn, err := c.Open(chconn.Tuning{DialTimeout: time.Second, ReadTimeout: 5 * time.Second, MaxOpenConns: 2})
	if err != nil {
		return nil, c.Database
	}
	g.OnStop("support clickhouse", func(context.Context) error { return conn.Close() })
	return conn, c.Database
}

// addSupport registers the support routes on mux behind the admin token
// and, per shared store, the reset listener; usage emits a quota reset's
// usage event.
func addSupport(g *lifecycle.Group, mux *http.ServeMux, cfg config, lim *enforcement.Limiter, auth *sharedtier.Tier, region *sharedtier.Region, info func() policylog.Info, usage func(key, scope, id string, res enforcement.Resolved, at time.Time), log *slog.Logger) {
	stores := auth.SupportStores()
	in := &support.Inspector{Limiters: cfg.Support.FleetURLs, Token: cfg.AuthToken,
		HTTP: &http.Client{Timeout: 5 * time.Second}, Stores: map[string]*redisstore.Store{}}
	rs := &support.Resetter{Keys: cfg.PolicyLog.Keys, Policy: lim.Policy, Instance: cfg.InstanceID,
		Forget: func(key, scope string) { lim.Forget(key, scope) }, Usage: usage}
	for i, s := range stores {
		ref := support.StoreRef{Name: s.Name, Store: s.Store}
		rs.Stores = append(rs.Stores, ref)
		if i == 0 {
			in.Store, in.Prefix = s.Store, s.Prefix
		} else {
			in.Stores[s.Name] = s.Store
		}
		client, prefix := s.Client, s.Prefix
		g.Add("reset listener "+s.Name, func(ctx context.Context) error {
			return support.Listen(ctx, client, prefix, func(key, scope string) { lim.Forget(key, scope) })
		})
	}
	in.ClickHouse, in.Database = openClickHouse(cfg.Support.ClickHouse, g)
	in.FallbackRule = func(key, scope string) (*support.Rule, error) {
		r, err := support.RuleFor(lim.Policy(), key, scope)
		if r != nil {
			r.From = "this limiter's policy"
		}
		return r, err
	}
	mux.Handle("GET /admin/keys/local", adminOnly(cfg.AuthToken, support.LocalHandler(support.Local{Limiter: lim, Instance: cfg.InstanceID, Policy: info, Lease: auth.LeaseHeld, Global: region.Inspect})))
	mux.Handle("GET /admin/keys/inspect", adminOnly(cfg.AuthToken, support.InspectHandler(in)))
	mux.Handle("POST /admin/keys/reset", adminOnly(cfg.AuthToken, support.ResetHandler(rs)))
	log.Debug("support routes", "fleet", len(in.Limiters), "stores", len(stores))
}
