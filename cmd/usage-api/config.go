package main

import (
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/internal/chcluster"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tlsconf"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/schema"
)

// config is everything the binary reads from the environment.
type config struct {
	Addr           string           // USAGE_API_ADDR
	ClickHouse     chconn.Config    // CLICKHOUSE_ADDR, _DATABASE, _USER, _PASSWORD (or _FILE), _TLS, _TLS_CA_FILE (internal/chconn)
	ClickHouseAddr string           // CLICKHOUSE_ADDR (native protocol); in cluster mode a node whose Distributed tables serve the reads
	Cluster        chcluster.Config // CLICKHOUSE_CLUSTER, CLICKHOUSE_SHARDS: cluster mode when set
	Database       string           // CLICKHOUSE_DATABASE
	AdminToken     string           // USAGE_ADMIN_TOKEN, required
	TokenSecret    string           // USAGE_TOKEN_SECRET, required
	PolicyFile     string           // POLICY_FILE: quotas and soft limits
	QueryTimeout   time.Duration    // USAGE_QUERY_TIMEOUT

	// Optional: the limiters' Redis, read by the quota view for what the
	// enforced counters say is left.
	Redis redisclient.Config // REDIS_* (internal/redisclient): no REDIS_ADDRS = the record only
	// Stores are the limiters' named stores (REDIS_STORES, read as the
	// limiter reads it): the support page inspects a key whose limit
	// names one there.
	Stores []redisclient.NamedStore

	// ListenTLS is the API's certificate (USAGE_API_TLS_CERT_FILE,
	// USAGE_API_TLS_KEY_FILE; re-read on SIGHUP); nil = plain HTTP.
	ListenTLS *tlsconf.ServerCert

	// PolicyLog: the operator's policy API (policyops.go).
	PolicyLog policyLogConfig

	// Billing: statements and corrections (billing.go).
	Billing billingConfig

	// Support: the support page's limiters (supportdesk.go).
	Support supportConfig
}

// minAdminToken is the shortest accepted USAGE_ADMIN_TOKEN, in bytes.
const minAdminToken = 16

// loadConfig reads and validates the configuration; the error names every
// bad variable, on one line.
func loadConfig(getenv func(string) string) (config, error) {
	e := envconfig.New(getenv)
	c := config{
		Addr:         e.String("USAGE_API_ADDR", "127.0.0.1:8081"),
		ClickHouse:   chconn.FromEnv(e, schema.ValidDatabase),
		AdminToken:   e.Secret("USAGE_ADMIN_TOKEN"),
		TokenSecret:  e.Secret("USAGE_TOKEN_SECRET"),
		PolicyFile:   e.String("POLICY_FILE", "deploy/policy.yaml"),
		QueryTimeout: e.Duration("USAGE_QUERY_TIMEOUT", 10*time.Second, 100*time.Millisecond, 5*time.Minute),
		Redis:        redisclient.FromEnv(e, limits.DefaultKeyPrefix),
		Cluster:      chcluster.FromEnv(e),
		PolicyLog:    policyLogConfigFrom(e, getenv),
		Billing:      billingConfigFrom(e),
		Support:      supportConfigFrom(e),
	}
	c.Stores = redisclient.StoresFromEnv(e, c.Redis, limits.ValidStoreName)
	e.HostPort("USAGE_API_ADDR", c.Addr)
	c.ListenTLS = tlsconf.ServerFromEnv(e, "USAGE_API_TLS_CERT_FILE", "USAGE_API_TLS_KEY_FILE")
	// Read (and checked) by chconn: copies for the code that names them.
	c.ClickHouseAddr, c.Database = c.ClickHouse.Addr, c.ClickHouse.Database
	switch {
	case c.AdminToken == "":
		e.Fail("USAGE_ADMIN_TOKEN", "required (the operator's bearer token, at least %d bytes)", minAdminToken)
	case len(c.AdminToken) < minAdminToken || strings.TrimSpace(c.AdminToken) != c.AdminToken:
		e.Fail("USAGE_ADMIN_TOKEN", "must be at least %d bytes, without surrounding spaces", minAdminToken)
	}
	switch {
	case c.TokenSecret == "":
		e.Fail("USAGE_TOKEN_SECRET", "required (signs portal tokens, at least %d bytes)", usage.MinSecretLen)
	case len(c.TokenSecret) < usage.MinSecretLen:
		e.Fail("USAGE_TOKEN_SECRET", "must be at least %d bytes", usage.MinSecretLen)
	}
	if c.AdminToken != "" && c.AdminToken == c.TokenSecret {
		e.Fail("USAGE_TOKEN_SECRET", "must differ from USAGE_ADMIN_TOKEN")
	}
	tracing.CheckConfig(e) // OTEL_*: with the others, before anything starts
	return c, e.Err()
}
