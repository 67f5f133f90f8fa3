package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/schema"
)

// config is everything the binary reads from the environment.
type config struct {
	Addr           string        // USAGE_API_ADDR
	ClickHouseAddr string        // CLICKHOUSE_ADDR (native protocol)
	Database       string        // CLICKHOUSE_DATABASE
	AdminToken     string        // USAGE_ADMIN_TOKEN, required
	TokenSecret    string        // USAGE_TOKEN_SECRET, required
	PolicyFile     string        // POLICY_FILE: quotas and soft limits
	QueryTimeout   time.Duration // USAGE_QUERY_TIMEOUT
}

// minAdminToken is the shortest accepted USAGE_ADMIN_TOKEN, in bytes.
const minAdminToken = 16

// loadConfig reads and validates the configuration; the error names every
// bad variable, on one line.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		Addr:           "127.0.0.1:8081",
		ClickHouseAddr: "127.0.0.1:9000",
		Database:       "ratelimit",
		PolicyFile:     "deploy/policy.yaml",
		QueryTimeout:   10 * time.Second,
	}
	var errs []error
	bad := func(name, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, a...)))
	}
	str := func(name string, dst *string) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			*dst = v
		}
	}
	hostPort := func(name, v string) {
		if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
			bad(name, "%q is not host:port", v)
		} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			bad(name, "%q has a bad port", v)
		}
	}
	str("USAGE_API_ADDR", &c.Addr)
	hostPort("USAGE_API_ADDR", c.Addr)
	str("CLICKHOUSE_ADDR", &c.ClickHouseAddr)
	hostPort("CLICKHOUSE_ADDR", c.ClickHouseAddr)
	str("CLICKHOUSE_DATABASE", &c.Database)
	if !schema.ValidDatabase.MatchString(c.Database) {
		bad("CLICKHOUSE_DATABASE", "%q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", c.Database)
	}
	c.AdminToken = getenv("USAGE_ADMIN_TOKEN")
	switch {
	case c.AdminToken == "":
		bad("USAGE_ADMIN_TOKEN", "required (the operator's bearer token, at least %d bytes)", minAdminToken)
	case len(c.AdminToken) < minAdminToken || strings.TrimSpace(c.AdminToken) != c.AdminToken:
		bad("USAGE_ADMIN_TOKEN", "must be at least %d bytes, without surrounding spaces", minAdminToken)
	}
	c.TokenSecret = getenv("USAGE_TOKEN_SECRET")
	switch {
	case c.TokenSecret == "":
		bad("USAGE_TOKEN_SECRET", "required (signs portal tokens, at least %d bytes)", usage.MinSecretLen)
	case len(c.TokenSecret) < usage.MinSecretLen:
		bad("USAGE_TOKEN_SECRET", "must be at least %d bytes", usage.MinSecretLen)
	}
	if c.AdminToken != "" && c.AdminToken == c.TokenSecret {
		bad("USAGE_TOKEN_SECRET", "must differ from USAGE_ADMIN_TOKEN")
	}
	str("POLICY_FILE", &c.PolicyFile)
	if v := strings.TrimSpace(getenv("USAGE_QUERY_TIMEOUT")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > 5*time.Minute {
			bad("USAGE_QUERY_TIMEOUT", "%q is not a duration in [100ms, 5m]", v)
		} else {
			c.QueryTimeout = d
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return c, nil
}
