package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/policylog/judge"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
)

// judgeComponent is the rollout judge (policylog/judge) when POLICY_JUDGE
// is true: every meter-consumer that runs it takes part in the election (a
// consumer group of the policy topic), and the one holding the topic's
// partition writes the verdict of each rollout once its shadow window is
// over (POLICY_JUDGE_SETTLE after its end, default 30 s). nil when off.
func judgeComponent(cfg config, conn driver.Conn, schemaReady *atomic.Bool, reg prometheus.Registerer, log *slog.Logger) (*component, error) {
	e := envconfig.New(os.Getenv)
	on := e.Bool("POLICY_JUDGE", false)
	topic := e.String("POLICY_TOPIC", kafkalog.DefaultTopic)
	settle := e.Duration("POLICY_JUDGE_SETTLE", 30*time.Second, 0, time.Hour)
	if err := e.Err(); err != nil {
		return nil, err
	}
	if !on {
		return nil, nil
	}
	l, err := kafkalog.New(kafkalog.Config{Brokers: cfg.KafkaBrokers, Topic: topic, Security: cfg.Kafka, ClientID: "meter-consumer-judge"})
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	jlog := log.With("component", "judge")
	j, err := judge.New(judge.Config{
		Log: l, Counter: judge.ClickHouse{Conn: conn, Database: cfg.Database},
		Brokers: cfg.KafkaBrokers, Topic: topic, Dialer: cfg.Kafka.Dialer("meter-consumer-judge", 10*time.Second),
		SessionTimeout: cfg.SessionTimeout, Settle: settle,
		Name:   fmt.Sprintf("judge@%s/%d", host, os.Getpid()),
		Logger: jlog, Registry: reg,
	})
	if err != nil {
		return nil, err
	}
	jlog.Info("rollout judge on: taking part in the election", "topic", topic, "settle", settle.String())
	return &component{
		name: "judge",
		run: func(ctx context.Context) error {
			defer l.Close()
			for !schemaReady.Load() { // rollout_shadow must exist
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(100 * time.Millisecond):
				}
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
