package main

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
)

// policyAuditComponent writes every record of the policy log
// (POLICY_TOPIC, default ratelimit.policy), applied or refused, into
// policy_audit (policylog/chaudit). A topic that does not exist yet (the
// policy log unused) is not a failure.
func policyAuditComponent(cfg config, conn driver.Conn, schemaReady *atomic.Bool, reg prometheus.Registerer, log *slog.Logger) (component, error) {
	topic := envconfig.New(os.Getenv).String("POLICY_TOPIC", kafkalog.DefaultTopic)
	l, err := kafkalog.New(kafkalog.Config{Brokers: cfg.KafkaBrokers, Topic: topic, Security: cfg.Kafka, ClientID: "meter-consumer-policy-audit"})
	if err != nil {
		return component{}, err
	}
	w, err := chaudit.New(chaudit.Config{Log: l, Conn: conn, Database: cfg.Database, Logger: log.With("component", "policy-audit"),
		Registry: reg, Absent: kafkalog.IsNoTopic})
	if err != nil {
		return component{}, err
	}
	return component{
		name: "policy-audit",
		run: func(ctx context.Context) error {
			defer l.Close()
			for !schemaReady.Load() { // policy_audit must exist
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(100 * time.Millisecond):
				}
			}
			return w.Run(ctx)
		},
		ready: w.Ready,
	}, nil
}
