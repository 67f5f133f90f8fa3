package main

import (
	"encoding/base64"
	"net/url"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/internal/chcluster"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/metering"
)

// config is everything the binary reads from the environment (CONTRACT.md,
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

	BatchSize      int           // METER_BATCH_SIZE, messages per ClickHouse batch
	BatchWait      time.Duration // METER_BATCH_WAIT, longest a message waits in a batch
	DedupWindow    int64         // METER_DEDUP_WINDOW, offsets per partition
	SessionTimeout time.Duration // METER_SESSION_TIMEOUT, consumer-group session
	StallAfter     time.Duration // METER_STALL_AFTER, stall watchdog: no progress with lag for this long

	// The quota reconciler (metering/reconcile) runs when REDIS_ADDRS is set.
	Redis          redisclient.Config // REDIS_* (internal/redisclient), the limiters' Redis
	PolicyFile     string             // POLICY_FILE, the limiters' policy (which quotas exist)
	ReconcileEvery time.Duration      // METER_RECONCILE_EVERY, between reconcile passes
}

// loadConfig reads and validates the configuration; the error names every
// bad variable, on one line.
func loadConfig(getenv func(string) string) (config, error) {
	e := envconfig.New(getenv)
	c := config{
		KafkaBrokers:    e.List("KAFKA_BROKERS"),
		KafkaTopic:      e.String("KAFKA_TOPIC", metering.DefaultTopic),
		Kafka:           kafkaconn.FromEnv(e, getenv),
		KafkaCheckEvery: e.Duration("METER_KAFKA_CHECK_EVERY", 10*time.Second, 100*time.Millisecond, time.Hour),
		ClickHouse:      chconn.FromEnv(e),
		MeterAddr:       e.String("METER_ADDR", "127.0.0.1:8082"),
		WebhookURL:      e.String("WEBHOOK_URL", ""),
		WebhookSecret:   strings.TrimSpace(e.Secret("WEBHOOK_SECRET")),
		BatchSize:       int(e.Int("METER_BATCH_SIZE", 50_000, 1, 1_000_000)),
		BatchWait:       e.Duration("METER_BATCH_WAIT", 500*time.Millisecond, time.Millisecond, time.Minute),
		DedupWindow:     e.Int("METER_DEDUP_WINDOW", 250_000, 1, 100_000_000),
		SessionTimeout:  e.Duration("METER_SESSION_TIMEOUT", kafkaconn.GroupSessionTimeout, time.Second, 5*time.Minute),
		StallAfter:      e.Duration("METER_STALL_AFTER", 2*time.Minute, time.Second, 24*time.Hour),
		Redis:           redisclient.FromEnv(e),
		PolicyFile:      e.String("POLICY_FILE", "deploy/policy.yaml"),
		ReconcileEvery:  e.Duration("METER_RECONCILE_EVERY", 30*time.Second, 100*time.Millisecond, time.Hour),
		Cluster:         chcluster.FromEnv(e),
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
	if c.WebhookURL != "" {
		if u, err := url.Parse(c.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			e.Fail("WEBHOOK_URL", "%q is not an http(s) URL", c.WebhookURL)
		}
		if c.WebhookSecret == "" {
			e.Fail("WEBHOOK_SECRET", "required when WEBHOOK_URL is set")
		}
	}
	if c.WebhookSecret != "" {
		raw, ok := strings.CutPrefix(c.WebhookSecret, "whsec_")
		if _, err := base64.StdEncoding.DecodeString(raw); !ok || raw == "" || err != nil {
			e.Fail("WEBHOOK_SECRET", "must be whsec_<base64>")
		}
	}
	return c, e.Err()
}
