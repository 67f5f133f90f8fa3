package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/rlsserver"
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/sharedtier"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyname"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/listenaddr"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tlsconf"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering"
)

// config is everything the limiter reads from its environment.
type config struct {
	Addr              string
	Redis             redisclient.Config       // every REDIS_* variable (internal/redisclient)
	Stores            []redisclient.NamedStore // REDIS_STORES: dedicated capacity beside the default store
	PolicyFile        string
	PolicyLog         policyLogConfig // POLICY_SOURCE, POLICY_TOPIC, POLICY_CACHE_DIR (policylog_tail.go)
	KafkaBrokers      []string
	KafkaTopic        string
	Kafka             *kafkaconn.Security // KAFKA_SASL_*, KAFKA_TLS*: how to reach the brokers
	KafkaCheckEvery   time.Duration       // LIMITER_KAFKA_CHECK_EVERY: between connection checks
	ExpectedInstances int
	AuthToken         string
	// AdminInsecure is LIMITER_ADMIN_INSECURE: serve /admin/* without a
	// token on an address beyond loopback.
	AdminInsecure bool
	// KeyNames is how keys are named in metrics and logs
	// (LIMITER_METRICS_KEY_SECRET, LIMITER_METRICS_RAW_KEYS;
	// enforcement/keyname).
	KeyNames   keyname.Namer
	InstanceID string

	StoreTimeout    time.Duration
	StoreInFlight   int // LIMITER_STORE_BATCHES_IN_FLIGHT: script calls in flight per server; 0 = redisstore's default
	BreakerFailures int
	BreakerOpenFor  time.Duration
	LocalHeadroom   float64
	DegradedRate    float64
	DegradedBurst   int64
	MaxKeys         int
	// LocalMaxBytes is LIMITER_LOCAL_MAX_BYTES, the local tier's heap
	// bound; 0 = localMaxBytes's default.
	LocalMaxBytes int64
	ShutdownGrace time.Duration
	EmitBuffer    int
	// SpoolDir is LIMITER_SPOOL_DIR, where the emitter keeps what Kafka
	// does not take (empty = no spool: lossy); SpoolMaxBytes its budget.
	SpoolDir       string
	SpoolMaxBytes  int64
	SpoolDrainRate float64       // LIMITER_SPOOL_DRAIN_RATE: spooled events/s sent back at most
	LeaseBlock     int           // 0 = token leasing off
	LeaseHotOps    float64       // decisions per second that make a key hot
	LeaseMaxHold   time.Duration // leased tokens unused this long go back
	FleetHeartbeat time.Duration // period of the fleet heartbeat (live instance count)
	ReservationTTL time.Duration // an unsettled reservation is settled at its estimate after this
	LeaseTTL       time.Duration // a concurrency slot not renewed this long returns (LIMITER_LEASE_TTL)
	EnvoyLeaseTTL  time.Duration // the lease of a slot taken at the Envoy door, which nobody renews (LIMITER_ENVOY_LEASE_TTL)
	Shadow         shadowConfig  // shadow limits beside enforcement (shadow.go)
	Support        supportConfig // inspect and reset (keyapi.go)

	// ListenTLS is the certificate of the HTTP and gRPC listeners
	// (LIMITER_TLS_CERT_FILE, LIMITER_TLS_KEY_FILE, both or neither), for
	// deployments without a service mesh; SIGHUP re-reads the pair (a
	// renewed certificate is served to new connections). nil = plain text.
	ListenTLS *tlsconf.ServerCert

	GRPCAddr          string // the Envoy rate limit service; empty = off
	GRPCAddrIsDefault bool   // LIMITER_GRPC_ADDR unset: a taken port is a warning, not a failure

	Headers      ratelimitheader.Mode // LIMITER_HEADERS: the fields of /check's "headers" object
	EnvoyHeaders ratelimitheader.Mode // LIMITER_ENVOY_HEADERS: the Envoy answers' response_headers_to_add

	// RegionConfig is LIMITER_REGION, LIMITER_REGIONS and GLOBAL_REDIS_*
	// (cmd/limiter/internal/sharedtier, region.go).
	sharedtier.RegionConfig
}

// loadConfig reads the environment; every problem is reported at once, each
// naming its variable, on one line.
func loadConfig(getenv func(string) string) (config, error) {
	e := envconfig.New(getenv)
	host, _ := os.Hostname()
	ms, s := time.Millisecond, time.Second
	c := config{
		Addr:              e.String("LIMITER_ADDR", "127.0.0.1:8080"),
		Redis:             redisclient.FromEnv(e, limits.DefaultKeyPrefix),
		PolicyFile:        e.String("POLICY_FILE", "deploy/policy.yaml"),
		KafkaBrokers:      e.List("KAFKA_BROKERS"),
		KafkaTopic:        e.String("KAFKA_TOPIC", metering.DefaultTopic),
		Kafka:             kafkaconn.FromEnv(e, getenv),
		KafkaCheckEvery:   e.Duration("LIMITER_KAFKA_CHECK_EVERY", kafkaconn.DefaultCheckEvery, 100*ms, time.Hour),
		ExpectedInstances: int(e.Int("LIMITER_EXPECTED_INSTANCES", 1, 1, 100000)),
		AuthToken:         strings.TrimSpace(e.Secret("LIMITER_AUTH_TOKEN")),
		InstanceID:        e.String("LIMITER_INSTANCE_ID", fmt.Sprintf("%s-%d", host, os.Getpid())),
		StoreTimeout:      e.Duration("LIMITER_STORE_TIMEOUT", 5*ms, 100*time.Microsecond, 10*s),
		StoreInFlight:     int(e.Int("LIMITER_STORE_BATCHES_IN_FLIGHT", 0, 0, 64)),
		BreakerFailures:   int(e.Int("LIMITER_BREAKER_FAILURES", 5, 1, 1000000)),
		BreakerOpenFor:    e.Duration("LIMITER_BREAKER_OPEN_FOR", s, 10*ms, 10*time.Minute),
		LocalHeadroom:     e.Float("LIMITER_LOCAL_HEADROOM", 2),
		DegradedRate:      e.Float("LIMITER_DEGRADED_MAX_RATE", 0),
		DegradedBurst:     e.Int("LIMITER_DEGRADED_MAX_BURST", 0, 0, 1<<50),
		MaxKeys:           int(e.Int("LIMITER_MAX_KEYS", 1_000_000, 1000, 1<<30)),
		LocalMaxBytes:     e.Int("LIMITER_LOCAL_MAX_BYTES", 0, 1<<20, 1<<40),
		ShutdownGrace:     e.Duration("LIMITER_SHUTDOWN_GRACE", 8*s, 100*ms, 10*s),
		EmitBuffer:        int(e.Int("LIMITER_EMIT_BUFFER", 65536, 16, 1<<24)),
		SpoolDir:          e.String("LIMITER_SPOOL_DIR", ""),
		SpoolMaxBytes:     e.Bytes("LIMITER_SPOOL_MAX_BYTES", 1<<30, 1<<20, 1<<50),
		SpoolDrainRate:    float64(e.Int("LIMITER_SPOOL_DRAIN_RATE", 10000, 100, 100_000_000)),
		LeaseBlock:        int(e.Int("LIMITER_LEASE_BLOCK", 0, 0, 1_000_000)),
		LeaseHotOps:       e.Float("LIMITER_LEASE_HOT_OPS", 500),
		LeaseMaxHold:      e.Duration("LIMITER_LEASE_MAX_HOLD", s, 10*ms, time.Hour),
		FleetHeartbeat:    e.Duration("LIMITER_FLEET_HEARTBEAT", 2*s, 10*ms, time.Minute),
		ReservationTTL:    e.Duration("LIMITER_RESERVATION_TTL", enforcement.DefaultReservationTTL, s, 24*time.Hour),
		LeaseTTL:          e.Duration("LIMITER_LEASE_TTL", slots.DefaultTTL, slots.MinTTL, time.Hour),
	}
	c.EnvoyLeaseTTL = e.Duration("LIMITER_ENVOY_LEASE_TTL", c.LeaseTTL, slots.MinTTL, time.Hour)
	c.Shadow = shadowConfigFrom(e, c.StoreTimeout)
	c.Support = supportConfigFrom(e)
	c.PolicyLog = policyLogConfigFrom(e, c.KafkaBrokers)
	c.Stores = redisclient.StoresFromEnv(e, c.Redis, limits.ValidStoreName)
	c.RegionConfig = sharedtier.RegionsFromEnv(e, c.Redis)
	e.HostPort("LIMITER_ADDR", c.Addr)
	for _, a := range c.KafkaBrokers {
		e.HostPort("KAFKA_BROKERS", a)
	}
	c.GRPCAddr, c.GRPCAddrIsDefault = rlsserver.AddrFromEnv(e)
	c.ListenTLS = tlsconf.ServerFromEnv(e, "LIMITER_TLS_CERT_FILE", "LIMITER_TLS_KEY_FILE")
	c.Headers = headerModeFrom(e, "LIMITER_HEADERS", "both")
	c.EnvoyHeaders = headerModeFrom(e, "LIMITER_ENVOY_HEADERS", "legacy")
	c.AdminInsecure = e.Bool("LIMITER_ADMIN_INSECURE", false)
	if c.AuthToken == "" && !c.AdminInsecure && !listenaddr.Loopback(c.Addr) {
		e.Fail("LIMITER_AUTH_TOKEN", "is empty while LIMITER_ADDR %q listens beyond loopback, where GET /admin/hot-keys would show raw keys to anyone: set a token, listen on loopback, or set LIMITER_ADMIN_INSECURE=true to serve it open", c.Addr)
	}
	keySecret, rawKeys := e.Secret("LIMITER_METRICS_KEY_SECRET"), e.Bool("LIMITER_METRICS_RAW_KEYS", false)
	if rawKeys && keySecret != "" {
		e.Fail("LIMITER_METRICS_RAW_KEYS", "is true while LIMITER_METRICS_KEY_SECRET is set: raw keys need no secret, set one of them")
	}
	c.KeyNames = keyname.Choose(keySecret, rawKeys)
	if c.LocalHeadroom < 1 {
		e.Fail("LIMITER_LOCAL_HEADROOM", "must be ≥ 1")
	}
	if (c.DegradedRate > 0) != (c.DegradedBurst > 0) {
		e.Fail("LIMITER_DEGRADED_MAX_RATE", "and LIMITER_DEGRADED_MAX_BURST must be set together")
	}
	tracing.CheckConfig(e) // OTEL_*: with the others, before anything starts
	return c, e.Err()
}

// headerModeFrom reads a rate-limit header mode (legacy, draft, both, none).
func headerModeFrom(e *envconfig.Reader, name, def string) ratelimitheader.Mode {
	m, err := ratelimitheader.ParseMode(e.String(name, def))
	if err != nil {
		e.Fail(name, "%v", err)
	}
	return m
}

// localMaxBytes is the local tier's heap bound: LIMITER_LOCAL_MAX_BYTES, or
// by default enforcement's (64 MiB), lowered to a quarter of the
// container's memory limit when that is smaller (container: 0 = none
// visible), so that a small pod keeps room for everything else.
func localMaxBytes(set, container int64) int64 {
	if set > 0 {
		return set
	}
	if container > 0 {
		return max(1<<20, min(enforcement.DefaultLocalMaxBytes, container/4))
	}
	return enforcement.DefaultLocalMaxBytes
}
