package kafkaemit_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
)

// The limiter builds one Emitter at start, runs it (Run, under the
// binary's lifecycle.Group), and calls Emit for every decision (it never
// blocks); at shutdown Run's context ends and Run flushes within
// FlushTimeout.
func Example() {
	reg := prometheus.NewRegistry()
	em, err := kafkaemit.New(kafkaemit.Config{
		Brokers:  []string{"127.0.0.1:9092"},
		Topic:    "ratelimit.decisions",
		Logger:   slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		Registry: reg,
	})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- em.Run(ctx) }()
	ids := metering.NewIDs()
	now := time.Now()
	em.Emit(metering.Event{
		EventID: ids.Next(now), TS: now.UnixMilli(), Key: "acct_8812", Scope: "api:search", Tier: "pro",
		Cost: 10, Allowed: true, Source: "shared", Remaining: 90, Limit: 100, Policy: "pro-search", Instance: "lim-1",
	})
	stop()
	_ = <-done // flushed, or what could not be sent counted as dropped
}
