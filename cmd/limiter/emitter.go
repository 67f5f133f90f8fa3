package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/metering/kafkaemit"
)

type closableSink interface {
	eventSink
	Close(ctx context.Context) error
}

// newEmitter starts the bounded, non-blocking Kafka emitter: a slow or dead
// broker drops (and counts) events, never slows a decision.
func newEmitter(cfg config, reg prometheus.Registerer, log *slog.Logger) (closableSink, error) {
	return kafkaemit.New(kafkaemit.Config{
		Brokers:  cfg.KafkaBrokers,
		Topic:    cfg.KafkaTopic,
		Buffer:   cfg.EmitBuffer,
		Logger:   log,
		Registry: reg,
	})
}
