package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/metering"
)

type closableSink interface {
	eventSink
	Close(ctx context.Context) error
}

func newEmitter(cfg config, reg prometheus.Registerer, log *slog.Logger) (closableSink, error) {
	_ = metering.Event{}
	return nil, errors.New("KAFKA_BROKERS: the Kafka emitter is being integrated")
}
