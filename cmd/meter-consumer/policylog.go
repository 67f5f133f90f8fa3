package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/judge"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
)

// policyAuditComponent writes every record of the policy log
// (POLICY_TOPIC), applied or refused, into policy_audit (policylog/chaudit).
// A topic that does not exist yet (the policy log unused) is not a failure.
func policyAuditComponent(cfg config, conn driver.Conn, schema schemaGate, reg prometheus.Registerer, log *slog.Logger) (component, error) {
	l, err := kafkalog.New(kafkalog.Config{Brokers: cfg.KafkaBrokers, Topic: cfg.PolicyTopic, Security: cfg.Kafka, ClientID: "meter-consumer-policy-audit"})
	if err != nil {
		return component{}, err
	}
	w, err := chaudit.New(chaudit.Config{Log: l, Conn: conn, Database: cfg.Database, Logger: log.With("component", "policy-audit"),
		Registry: reg, Absent: kafkalog.IsNoTopic, Keys: cfg.PolicyKeys.Ring})
	if err != nil {
		return component{}, err
	}
	return component{
		name: "policy-audit",
		run: func(ctx context.Context) error {
			defer l.Close()
			if !schema.wait(ctx) { // policy_audit must exist
				return nil
			}
			return w.Run(ctx)
		},
		ready: w.Ready,
	}, nil
}

// judgeComponent is the rollout judge (policylog/judge) when POLICY_JUDGE
// is true: every meter-consumer that runs it takes part in the election (a
// consumer group of the policy topic), and the one holding the topic's
// partition writes the verdict of each rollout once its shadow window is
// over (POLICY_JUDGE_SETTLE after its end). nil when off.
func judgeComponent(cfg config, conn driver.Conn, schema schemaGate, reg prometheus.Registerer, log *slog.Logger) (*component, error) {
	if !cfg.Judge {
		return nil, nil
	}
	l, err := kafkalog.New(kafkalog.Config{Brokers: cfg.KafkaBrokers, Topic: cfg.PolicyTopic, Security: cfg.Kafka, ClientID: "meter-consumer-judge"})
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	jlog := log.With("component", "judge")
	j, err := judge.New(judge.Config{
		Log: l, Counter: judge.ClickHouse{Conn: conn, Database: cfg.Database},
		Brokers: cfg.KafkaBrokers, Topic: cfg.PolicyTopic, Dialer: cfg.Kafka.Dialer("meter-consumer-judge", 10*time.Second),
		SessionTimeout: cfg.SessionTimeout, Settle: cfg.JudgeSettle,
		Name:   fmt.Sprintf("judge@%s/%d", host, os.Getpid()),
		Logger: jlog, Registry: reg, Keys: cfg.PolicyKeys,
	})
	if err != nil {
		return nil, err
	}
	jlog.Info("rollout judge on: taking part in the election", "topic", cfg.PolicyTopic, "settle", cfg.JudgeSettle.String())
	return &component{
		name: "judge",
		run: func(ctx context.Context) error {
			defer l.Close()
			if !schema.wait(ctx) { // rollout_shadow must exist
				return nil
			}
			// The election needs the topic; a judge may start before any
			// writer created it.
			for ctx.Err() == nil {
				ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := l.Ensure(ectx)
				cancel()
				if err == nil {
					break
				}
				jlog.Warn("rollout judge: the policy topic is not ready; retrying", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			return j.Run(ctx)
		},
		ready: j.Ready,
	}, nil
}
