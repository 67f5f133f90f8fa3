package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/metering"
)

// eventSink is what the limiter needs of the metering emitter: a call that
// never blocks a decision.
type eventSink interface {
	Emit(ev metering.Event)
}

// meteringRecorder turns each decision into a decision event. It is where
// enforcement meets metering; neither package imports the other.
type meteringRecorder struct {
	sink     eventSink
	ids      *metering.IDs
	instance string
}

func (m *meteringRecorder) Record(req enforcement.Request, d enforcement.Decision, at time.Time) {
	m.sink.Emit(metering.Event{
		EventID:   m.ids.Next(at),
		TS:        at.UnixMilli(),
		Key:       req.Key,
		Scope:     req.Scope,
		Tier:      d.Tier,
		Cost:      uint64(d.Cost),
		Allowed:   d.Allowed,
		Source:    d.Source.String(),
		Remaining: d.Remaining,
		Limit:     d.Limit,
		Policy:    d.Policy,
		DryRun:    d.DryRun,
		Warning:   d.Warning,
		Instance:  m.instance,
		// The shadow verdict, when a shadow limit was evaluated.
		Shadow:         d.Shadow.Name,
		ShadowRejected: d.Shadow.Name != "" && !d.Shadow.WouldAllow,
		Domain:         req.Domain,
	})
}

// buildRecorder starts the Kafka emitter when KAFKA_BROKERS is set.
func buildRecorder(cfg config, reg prometheus.Registerer, log *slog.Logger) (enforcement.Recorder, func(context.Context) error, error) {
	if len(cfg.KafkaBrokers) == 0 {
		log.Warn("KAFKA_BROKERS is empty: metering is off, decisions are not recorded")
		return nil, func(context.Context) error { return nil }, nil
	}
	em, err := newEmitter(cfg, reg, log)
	if err != nil {
		return nil, nil, err
	}
	return &meteringRecorder{sink: em, ids: metering.NewIDs(), instance: cfg.InstanceID}, em.Close, nil
}
