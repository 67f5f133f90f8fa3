package main

import (
	"regexp"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/internal/chcluster"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/metering/notify"
	"github.com/ratewarden/ratewarden/metering/reconcile"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/judge"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/schema"
)

// config is everything the binary reads from the environment (docs/reference.md,
// "meter-consumer"), plus tuning knobs prefixed METER_.
type config struct {
	KafkaBrokers    []string            // KAFKA_BROKERS, required
	KafkaTopic      string              // KAFKA_TOPIC
	Kafka           *kafkaconn.Security // KAFKA_SASL_*, KAFKA_TLS*: how to reach the brokers
	KafkaCheckEvery time.Duration       // METER_KAFKA_CHECK_EVERY: between connection checks
	ClickHouse      chconn.Config       // CLICKHOUSE_ADDR, _DATABASE, _USER, _PASSWORD (or _FILE), _TLS, _TLS_CA_FILE (internal/chconn)
	ClickHouseAddr  string              // CLICKHOUSE_ADDR (native protocol); in cluster mode a node whose Distributed tables serve the reconciler and notifier
	Cluster         chcluster.Config    // CLICKHOUSE_CLUSTER, CLICKHOUSE_SHARDS: cluster mode when set
	Database        string              // CLICKHOUSE_DATABASE
	MeterAddr       string              // METER_ADDR: /healthz, /readyz, /metrics
	WebhookURL      string              // WEBHOOK_URL: empty = notifier off
	WebhookSecret   string              // WEBHOOK_SECRET: whsec_<base64>, required with WEBHOOK_URL
	WebhookFile     string              // WEBHOOK_ENDPOINTS_FILE: per-key endpoints
	WebhookCooldown time.Duration       // WEBHOOK_COOLDOWN: one notification per key and scope per cool-down

	BatchSize      int           // METER_BATCH_SIZE, messages per ClickHouse batch
	BatchWait      time.Duration // METER_BATCH_WAIT, longest a message waits in a batch
	DedupWindow    int64         // METER_DEDUP_WINDOW, offsets per partition
	SessionTimeout time.Duration // METER_SESSION_TIMEOUT, consumer-group session
	StallAfter     time.Duration // METER_STALL_AFTER, stall watchdog: no progress with lag for this long

	// The quota reconciler (metering/reconcile) runs when REDIS_ADDRS is set.
	Redis          redisclient.Config // REDIS_* (internal/redisclient), the limiters' Redis
	PolicyFile     string             // POLICY_FILE, the limiters' policy (which quotas exist)
	ReconcileEvery time.Duration      // METER_RECONCILE_EVERY, between reconcile passes
	// ReconcileRegion is METER_RECONCILE_REGION: the region whose Redis
	// REDIS_ADDRS is ("" = one region). Its regional quota counters are
	// raised to its own usage, global ones to every region's.
	ReconcileRegion string
	// GlobalRedis is GLOBAL_REDIS_* (as the limiters'): the home region's
	// Redis, where global quotas' counters are raised; with a region only.
	GlobalRedis redisclient.Config

	// The policy log (docs/policy.md): its audit always, its judge when on.
	PolicyTopic string        // POLICY_TOPIC
	Judge       bool          // POLICY_JUDGE: take part in the rollout judge's election
	JudgeSettle time.Duration // POLICY_JUDGE_SETTLE: after a rollout's end, before its counters are read
	// PolicyKeys: POLICY_SIGNING_KEY_FILE (the judge signs its verdicts)
	// and POLICY_TRUSTED_KEYS_FILE (the audit and the judge judge every
	// record by it).
	PolicyKeys policylog.Keys
}

// loadConfig reads and validates the configuration; the error names every
// bad variable, on one line.
func loadConfig(getenv func(string) string) (config, error) {
	e := envconfig.New(getenv)
	c := config{
		KafkaBrokers:    e.List("KAFKA_BROKERS"),
		KafkaTopic:      e.String("KAFKA_TOPIC", metering.DefaultTopic),
		Kafka:           kafkaconn.FromEnv(e, getenv),
		KafkaCheckEvery: e.Duration("METER_KAFKA_CHECK_EVERY", kafkaconn.DefaultCheckEvery, 100*time.Millisecond, time.Hour),
		ClickHouse:      chconn.FromEnv(e, schema.ValidDatabase),
		MeterAddr:       e.String("METER_ADDR", "127.0.0.1:8082"),
		WebhookURL:      e.String("WEBHOOK_URL", ""),
		WebhookSecret:   strings.TrimSpace(e.Secret("WEBHOOK_SECRET")),
		WebhookFile:     e.String("WEBHOOK_ENDPOINTS_FILE", ""),
		WebhookCooldown: e.Duration("WEBHOOK_COOLDOWN", notify.DefaultCooldown, time.Nanosecond, 10*365*24*time.Hour),
		BatchSize:       int(e.Int("METER_BATCH_SIZE", consumer.DefaultBatchSize, 1, 1_000_000)),
		BatchWait:       e.Duration("METER_BATCH_WAIT", consumer.DefaultBatchWait, time.Millisecond, time.Minute),
		DedupWindow:     e.Int("METER_DEDUP_WINDOW", consumer.DefaultDedupWindow, 1, 100_000_000),
		SessionTimeout:  e.Duration("METER_SESSION_TIMEOUT", kafkaconn.GroupSessionTimeout, time.Second, 5*time.Minute),
		StallAfter:      e.Duration("METER_STALL_AFTER", consumer.DefaultStallAfter, time.Second, 24*time.Hour),
		Redis:           redisclient.FromEnv(e, limits.DefaultKeyPrefix),
		PolicyFile:      e.String("POLICY_FILE", "deploy/policy.yaml"),
		ReconcileEvery:  e.Duration("METER_RECONCILE_EVERY", reconcile.DefaultEvery, 100*time.Millisecond, time.Hour),
		ReconcileRegion: e.String("METER_RECONCILE_REGION", ""),
		GlobalRedis:     redisclient.FromEnvPrefix(e, "GLOBAL_REDIS", limits.DefaultKeyPrefix),
		Cluster:         chcluster.FromEnv(e),
		PolicyTopic:     e.String("POLICY_TOPIC", kafkalog.DefaultTopic),
		Judge:           e.Bool("POLICY_JUDGE", false),
		JudgeSettle:     e.Duration("POLICY_JUDGE_SETTLE", judge.DefaultSettle, time.Millisecond, time.Hour),
	}
	keys, err := policylog.LoadKeys(e.String("POLICY_SIGNING_KEY_FILE", ""), e.String("POLICY_TRUSTED_KEYS_FILE", ""))
	if err != nil {
		e.Fail("POLICY_SIGNING_KEY_FILE/POLICY_TRUSTED_KEYS_FILE", "%v", err)
	}
	c.PolicyKeys = keys
	if r := c.ReconcileRegion; r != "" && !regionName.MatchString(r) {
		e.Fail("METER_RECONCILE_REGION", "%q is not a region name (1 to 32 of a-z, 0-9 and '-', as LIMITER_REGION)", clipValue(r))
	}
	if c.ReconcileRegion == "" && c.GlobalRedis.Enabled() {
		e.Fail("GLOBAL_REDIS_ADDRS", "is set while METER_RECONCILE_REGION is empty: the home Redis keeps the quotas of global limits across regions only")
	}
	if len(c.KafkaBrokers) == 0 {
		e.Fail("KAFKA_BROKERS", "required (comma-separated host:port)")
	}
	for _, b := range c.KafkaBrokers {
		e.HostPort("KAFKA_BROKERS", b)
	}
	// Read (and checked) by chconn: copies for the code that names them.
	c.ClickHouseAddr, c.Database = c.ClickHouse.Addr, c.ClickHouse.Database
	e.HostPort("METER_ADDR", c.MeterAddr)
	// The notifier's own rules (metering/notify), checked here so that a
	// bad value is a configuration error like every other.
	if c.WebhookURL != "" {
		if err := notify.CheckURL(c.WebhookURL); err != nil {
			e.Fail("WEBHOOK_URL", "%v", err)
		}
		if c.WebhookSecret == "" {
			e.Fail("WEBHOOK_SECRET", "required when WEBHOOK_URL is set")
		}
	}
	if c.WebhookSecret != "" {
		if _, err := notify.ParseSecret(c.WebhookSecret); err != nil {
			e.Fail("WEBHOOK_SECRET", "%v", err)
		}
	}
	tracing.CheckConfig(e) // OTEL_*: with the others, before anything starts
	return c, e.Err()
}

// regionName is what METER_RECONCILE_REGION may be: a LIMITER_REGION.
var regionName = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

func clipValue(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
