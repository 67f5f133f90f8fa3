package main

// The support page's API (docs/support.md, "The support page"): find a
// key, inspect it and reset it, for an operator's credential. It runs the
// support package as the limiter's admin API does; this file reads its
// configuration and wires it.

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
	"github.com/ratewarden/ratewarden/support"
)

// supportConfig is what the support page reads beyond the usage API's own
// variables: the limiters it asks and resets through, as `limiter key`
// does.
type supportConfig struct {
	FleetURLs    []string // LIMITER_FLEET_URLS; empty = inspect shows no limiter, resets answer 502
	LimiterToken string   // LIMITER_AUTH_TOKEN: the limiters' admin token
}

func supportConfigFrom(e *envconfig.Reader) supportConfig {
	return supportConfig{FleetURLs: e.List("LIMITER_FLEET_URLS"), LimiterToken: e.Secret("LIMITER_AUTH_TOKEN")}
}

// withSupport routes the support desk beside next. rdb (REDIS_ADDRS, may
// be nil) is the shared store read for the bucket and the audit, named
// REDIS_STORES's stores by name (a key whose limit names one is read
// there); override reads an override's record in the policy log
// (opsapi's).
func withSupport(cfg config, conn driver.Conn, rdb redis.UniversalClient, named map[string]*redisstore.Store, override func(ctx context.Context, key, scope string) (policylog.Record, bool, error),
	next http.Handler, log *slog.Logger) (http.Handler, error) {
	creds, err := opsapi.NewCredentials(cfg.PolicyLog.TokensFile, cfg.AdminToken)
	if err != nil {
		return nil, err
	}
	in := &support.Inspector{Limiters: cfg.Support.FleetURLs, Token: cfg.Support.LimiterToken,
		HTTP: &http.Client{Timeout: 5 * time.Second}, ClickHouse: conn, Database: cfg.Database, Stores: named}
	if len(cfg.PolicyLog.Brokers) > 0 {
		in.OverrideRecord = override
	}
	if rdb != nil {
		in.Store, in.Prefix = redisstore.New(rdb, cfg.Redis.KeyPrefix), cfg.Redis.KeyPrefix
	}
	if cfg.PolicyFile != "" {
		cur := policy.NewCurrent(cfg.PolicyFile, func(err error) {
			log.Warn("policy file refused; keeping the previous one", "path", cfg.PolicyFile, "err", err)
		})
		in.FallbackRule = func(key, scope string) (*support.Rule, error) {
			p, err := cur.Get()
			if err != nil {
				return nil, err
			}
			r, err := support.RuleFor(p, key, scope)
			if r != nil {
				r.From = cfg.PolicyFile
			}
			return r, err
		}
	}
	if len(in.Limiters) == 0 {
		log.Warn("LIMITER_FLEET_URLS is empty: the support page shows no limiter's view and cannot reset keys")
	}
	desk := &support.Desk{Inspector: in, Signer: cfg.PolicyLog.Keys.Signer, Instance: "usage-api",
		Authenticate: func(r *http.Request) (support.Operator, bool) {
			tok, ok := bearer.Token(r.Header.Get("Authorization"))
			if !ok {
				return support.Operator{}, false
			}
			p, ok, _ := creds.Lookup(tok) // a broken file leaves USAGE_ADMIN_TOKEN working
			if !ok {
				return support.Operator{}, false
			}
			return support.Operator{Identity: p.Identity, MayReset: p.Role == opsapi.RolePolicy || p.Role == opsapi.RoleOverrides}, true
		}}
	mux := http.NewServeMux()
	for _, p := range support.DeskRoutes() {
		mux.Handle(p, desk)
	}
	mux.Handle("/", next)
	return mux, nil
}
