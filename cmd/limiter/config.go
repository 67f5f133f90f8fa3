package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// config is everything the limiter reads from its environment.
type config struct {
	Addr              string
	RedisAddrs        []string
	RedisPassword     string
	RedisKeyPrefix    string
	PolicyFile        string
	KafkaBrokers      []string
	KafkaTopic        string
	ExpectedInstances int
	AuthToken         string
	InstanceID        string

	StoreTimeout    time.Duration
	BreakerFailures int
	BreakerOpenFor  time.Duration
	LocalHeadroom   float64
	DegradedRate    float64
	DegradedBurst   int64
	MaxKeys         int
	ShutdownGrace   time.Duration
	EmitBuffer      int
	LeaseBlock      int           // 0 = token leasing off
	LeaseHotOps     float64       // decisions per second that make a key hot
	LeaseMaxHold    time.Duration // leased tokens unused this long go back
}

// loadConfig reads the environment; every problem is reported at once, each
// naming its variable.
func loadConfig(getenv func(string) string) (config, error) {
	e := envReader{get: getenv}
	host, _ := os.Hostname()
	c := config{
		Addr:              e.str("LIMITER_ADDR", "127.0.0.1:8080"),
		RedisAddrs:        e.list("REDIS_ADDRS"),
		RedisPassword:     e.str("REDIS_PASSWORD", ""),
		RedisKeyPrefix:    e.str("REDIS_KEY_PREFIX", "rl"),
		PolicyFile:        e.str("POLICY_FILE", "deploy/policy.yaml"),
		KafkaBrokers:      e.list("KAFKA_BROKERS"),
		KafkaTopic:        e.str("KAFKA_TOPIC", "ratelimit.decisions"),
		ExpectedInstances: e.int("LIMITER_EXPECTED_INSTANCES", 1, 1, 100000),
		AuthToken:         e.str("LIMITER_AUTH_TOKEN", ""),
		InstanceID:        e.str("LIMITER_INSTANCE_ID", fmt.Sprintf("%s-%d", host, os.Getpid())),
		StoreTimeout:      e.duration("LIMITER_STORE_TIMEOUT", 5*time.Millisecond),
		BreakerFailures:   e.int("LIMITER_BREAKER_FAILURES", 5, 1, 1000000),
		BreakerOpenFor:    e.duration("LIMITER_BREAKER_OPEN_FOR", time.Second),
		LocalHeadroom:     e.float("LIMITER_LOCAL_HEADROOM", 2),
		DegradedRate:      e.float("LIMITER_DEGRADED_MAX_RATE", 0),
		DegradedBurst:     int64(e.int("LIMITER_DEGRADED_MAX_BURST", 0, 0, 1<<50)),
		MaxKeys:           e.int("LIMITER_MAX_KEYS", 1_000_000, 1000, 1<<30),
		ShutdownGrace:     e.duration("LIMITER_SHUTDOWN_GRACE", 8*time.Second),
		EmitBuffer:        e.int("LIMITER_EMIT_BUFFER", 65536, 16, 1<<24),
		LeaseBlock:        e.int("LIMITER_LEASE_BLOCK", 0, 0, 1_000_000),
		LeaseHotOps:       e.float("LIMITER_LEASE_HOT_OPS", 500),
		LeaseMaxHold:      e.duration("LIMITER_LEASE_MAX_HOLD", time.Second),
	}
	if c.LocalHeadroom < 1 {
		e.fail("LIMITER_LOCAL_HEADROOM", "must be ≥ 1")
	}
	if (c.DegradedRate > 0) != (c.DegradedBurst > 0) {
		e.fail("LIMITER_DEGRADED_MAX_RATE", "and LIMITER_DEGRADED_MAX_BURST must be set together")
	}
	if c.ShutdownGrace > 10*time.Second {
		e.fail("LIMITER_SHUTDOWN_GRACE", "must be at most 10s")
	}
	return c, errors.Join(e.errs...)
}

type envReader struct {
	get  func(string) string
	errs []error
}

func (e *envReader) fail(name, format string, args ...any) {
	e.errs = append(e.errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
}

func (e *envReader) str(name, def string) string {
	if v := strings.TrimSpace(e.get(name)); v != "" {
		return v
	}
	return def
}

func (e *envReader) list(name string) []string {
	var out []string
	for _, s := range strings.Split(e.get(name), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (e *envReader) int(name string, def, lo, hi int) int {
	v := strings.TrimSpace(e.get(name))
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		e.fail(name, "must be an integer between %d and %d, got %q", lo, hi, v)
		return def
	}
	return n
}

func (e *envReader) float(name string, def float64) float64 {
	v := strings.TrimSpace(e.get(name))
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		e.fail(name, "must be a number ≥ 0, got %q", v)
		return def
	}
	return f
}

func (e *envReader) duration(name string, def time.Duration) time.Duration {
	v := strings.TrimSpace(e.get(name))
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		e.fail(name, "must be a positive duration such as 5ms, got %q", v)
		return def
	}
	return d
}
