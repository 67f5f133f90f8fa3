package decisionevents

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/metering/spool"
)

// newEmitter builds the bounded, non-blocking Kafka emitter: a slow or dead
// broker never slows a decision; its events go to the spool in
// LIMITER_SPOOL_DIR, or without one are dropped (and counted). Its flush at
// shutdown is bounded by cfg.FlushTimeout.
// refusing is the connection checker's verdict that Kafka refuses the
// limiter's credential or TLS handshake: a write failing meanwhile is
// counted as refused.
func newEmitter(cfg Config, refusing func() bool, reg prometheus.Registerer, log *slog.Logger) (*kafkaemit.Emitter, error) {
	var sp *spool.Spool
	if cfg.SpoolDir == "" {
		log.Info("LIMITER_SPOOL_DIR is empty: decision events Kafka does not take in time are dropped and counted (no spool)")
	} else {
		var err error
		if sp, err = spool.Open(spool.Config{Dir: cfg.SpoolDir, MaxBytes: cfg.SpoolMaxBytes}); err != nil {
			return nil, fmt.Errorf("LIMITER_SPOOL_DIR: %w", err)
		}
	}
	em, err := kafkaemit.New(kafkaemit.Config{
		Brokers:      cfg.Brokers,
		Topic:        cfg.Topic,
		Buffer:       cfg.Buffer,
		FlushTimeout: cfg.FlushTimeout,
		TLS:          cfg.Security.TLS,
		SASL:         cfg.Security.SASL,
		Spool:        sp,
		DrainRate:    cfg.SpoolDrainRate,
		Refusing:     refusing,
		Logger:       log,
		Registry:     reg,
	})
	if err != nil && sp != nil {
		sp.Close()
	}
	return em, err
}

// newKafkaChecker checks the emitter's connection settings (TLS, SASL) at
// start and every LIMITER_KAFKA_CHECK_EVERY: a refused credential is an
// error line at start, a reason in /readyz and a counted metric, instead
// of every event dropped in silence.
func newKafkaChecker(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*kafkaconn.Checker, error) {
	return kafkaconn.NewChecker(kafkaconn.CheckerConfig{
		Brokers: cfg.Brokers, Security: cfg.Security, ClientID: "limiter",
		Every: cfg.CheckEvery, Logger: log, Registry: reg,
	})
}
