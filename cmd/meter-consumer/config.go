package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/schema"
)

// config is everything the binary reads from the environment (CONTRACT.md,
// "meter-consumer"), plus tuning knobs prefixed METER_.
type config struct {
	KafkaBrokers   []string // KAFKA_BROKERS, required
	KafkaTopic     string   // KAFKA_TOPIC
	ClickHouseAddr string   // CLICKHOUSE_ADDR (native protocol)
	Database       string   // CLICKHOUSE_DATABASE
	MeterAddr      string   // METER_ADDR: /healthz, /readyz, /metrics
	WebhookURL     string   // WEBHOOK_URL: empty = notifier off
	WebhookSecret  string   // WEBHOOK_SECRET: whsec_<base64>, required with WEBHOOK_URL

	BatchSize      int           // METER_BATCH_SIZE, messages per ClickHouse batch
	BatchWait      time.Duration // METER_BATCH_WAIT, longest a message waits in a batch
	DedupWindow    int64         // METER_DEDUP_WINDOW, offsets per partition
	SessionTimeout time.Duration // METER_SESSION_TIMEOUT, consumer-group session
}

// loadConfig reads and validates the configuration; the error names every
// bad variable, on one line.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		KafkaTopic:     "ratelimit.decisions",
		ClickHouseAddr: "127.0.0.1:9000",
		Database:       "ratelimit",
		MeterAddr:      "127.0.0.1:8082",
		BatchSize:      50_000,
		BatchWait:      500 * time.Millisecond,
		DedupWindow:    250_000,
		SessionTimeout: 10 * time.Second,
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

	if v := strings.TrimSpace(getenv("KAFKA_BROKERS")); v == "" {
		bad("KAFKA_BROKERS", "required (comma-separated host:port)")
	} else {
		for _, b := range strings.Split(v, ",") {
			b = strings.TrimSpace(b)
			hostPort("KAFKA_BROKERS", b)
			c.KafkaBrokers = append(c.KafkaBrokers, b)
		}
	}
	str("KAFKA_TOPIC", &c.KafkaTopic)
	str("CLICKHOUSE_ADDR", &c.ClickHouseAddr)
	hostPort("CLICKHOUSE_ADDR", c.ClickHouseAddr)
	str("CLICKHOUSE_DATABASE", &c.Database)
	if !schema.ValidDatabase.MatchString(c.Database) {
		bad("CLICKHOUSE_DATABASE", "%q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", c.Database)
	}
	str("METER_ADDR", &c.MeterAddr)
	hostPort("METER_ADDR", c.MeterAddr)

	str("WEBHOOK_URL", &c.WebhookURL)
	str("WEBHOOK_SECRET", &c.WebhookSecret)
	if c.WebhookURL != "" {
		if u, err := url.Parse(c.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("WEBHOOK_URL", "%q is not an http(s) URL", c.WebhookURL)
		}
		if c.WebhookSecret == "" {
			bad("WEBHOOK_SECRET", "required when WEBHOOK_URL is set")
		}
	}
	if c.WebhookSecret != "" {
		raw, ok := strings.CutPrefix(c.WebhookSecret, "whsec_")
		if _, err := base64.StdEncoding.DecodeString(raw); !ok || raw == "" || err != nil {
			bad("WEBHOOK_SECRET", "must be whsec_<base64>")
		}
	}

	intVar := func(name string, lo, hi int64, dst func(int64)) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < lo || n > hi {
				bad(name, "%q is not an integer in [%d, %d]", v, lo, hi)
				return
			}
			dst(n)
		}
	}
	durVar := func(name string, lo, hi time.Duration, dst *time.Duration) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < lo || d > hi {
				bad(name, "%q is not a duration in [%s, %s]", v, lo, hi)
				return
			}
			*dst = d
		}
	}
	intVar("METER_BATCH_SIZE", 1, 1_000_000, func(n int64) { c.BatchSize = int(n) })
	intVar("METER_DEDUP_WINDOW", 1, 100_000_000, func(n int64) { c.DedupWindow = n })
	durVar("METER_BATCH_WAIT", time.Millisecond, time.Minute, &c.BatchWait)
	durVar("METER_SESSION_TIMEOUT", time.Second, 5*time.Minute, &c.SessionTimeout)

	if err := errors.Join(errs...); err != nil {
		return c, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return c, nil
}
