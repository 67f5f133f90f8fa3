package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
)

// newEmitter builds the bounded, non-blocking Kafka emitter: a slow or dead
// broker drops (and counts) events, never slows a decision. Its flush at
// shutdown gets half the grace: the HTTP and gRPC drains come before it.
func newEmitter(cfg config, reg prometheus.Registerer, log *slog.Logger) (*kafkaemit.Emitter, error) {
	return kafkaemit.New(kafkaemit.Config{
		Brokers:      cfg.KafkaBrokers,
		Topic:        cfg.KafkaTopic,
		Buffer:       cfg.EmitBuffer,
		FlushTimeout: cfg.ShutdownGrace / 2,
		TLS:          cfg.Kafka.TLS,
		SASL:         cfg.Kafka.SASL,
		Logger:       log,
		Registry:     reg,
	})
}

// newKafkaChecker checks the emitter's connection settings (TLS, SASL) at
// start and every LIMITER_KAFKA_CHECK_EVERY: a refused credential is an
// error line at start, a reason in /readyz and a counted metric, instead
// of every event dropped in silence.
func newKafkaChecker(cfg config, reg prometheus.Registerer, log *slog.Logger) (*kafkaconn.Checker, error) {
	return kafkaconn.NewChecker(kafkaconn.CheckerConfig{
		Brokers: cfg.KafkaBrokers, Security: cfg.Kafka, ClientID: "limiter",
		Every: cfg.KafkaCheckEvery, Logger: log, Registry: reg,
	})
}
