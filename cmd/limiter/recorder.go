package main

import (
	"context"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
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
	// revision is the policy log's revision in force (log mode); nil in
	// file mode.
	revision func() int64
}

func (m *meteringRecorder) Record(req enforcement.Request, d enforcement.Decision, at time.Time) {
	var traceID string // only sampled decisions carry one (tracing.go)
	if req.TraceID != ([16]byte{}) {
		traceID = hex.EncodeToString(req.TraceID[:])
	}
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
		ShadowRevision: d.Shadow.Rollout,
		Domain:         req.Domain,
		PolicyRevision: m.policyRevision(),
		TraceID:        traceID,
		DecidedUS:      d.DecidedUS,
		Reservation:    d.Reservation,
		Kind:           reserveKind(d.Reservation),
	})
}

// reserveKind marks a reserving decision's event as a decision; a plain
// decision's event carries no kind (its bytes are as before).
func reserveKind(reservation string) string {
	if reservation == "" {
		return ""
	}
	return metering.KindDecision
}

// reservedTS is a settle's reservation time in ms (0 for a charge).
func reservedTS(at time.Time) int64 {
	if at.IsZero() {
		return 0
	}
	return at.UnixMilli()
}

// RecordSettlement implements enforcement.SettlementRecorder: a settle or a
// charge is an event of its kind, with the estimate and the actual cost.
func (m *meteringRecorder) RecordSettlement(s enforcement.Settlement, at time.Time) {
	m.sink.Emit(metering.Event{
		EventID:        m.ids.Next(at),
		TS:             at.UnixMilli(),
		Key:            s.Key,
		Scope:          s.Scope,
		Tier:           s.Tier,
		Allowed:        true,
		Source:         enforcement.SourceShared.String(),
		Remaining:      s.Remaining,
		Limit:          s.Limit,
		Policy:         s.Policy,
		Instance:       m.instance,
		Warning:        s.Warning, // soft-limit webhooks follow actual costs
		PolicyRevision: m.policyRevision(),
		Kind:           s.Kind,
		Reservation:    s.Reservation,
		Estimate:       uint64(max(0, s.Estimate)),
		Actual:         uint64(max(0, s.Charged)),
		ReservedTS:     reservedTS(s.ReservedAt),
	})
}

func (m *meteringRecorder) policyRevision() int64 {
	if m.revision == nil {
		return 0
	}
	return m.revision()
}

// meteringParts is the Kafka side of the limiter: the recorder that turns
// decisions into events, and what run needs to run and report it.
type meteringParts struct {
	rec   enforcement.Recorder  // nil when metering is off
	ready func() (bool, string) // nil when metering is off
	// spool is the emitter's spool state; nil when metering is off.
	spool func() (kafkaemit.SpoolStatus, bool)
	onHUP func() // re-reads the Kafka password
	// add registers the emitter and its connection checker (nothing when
	// metering is off).
	add func(g *lifecycle.Group)
}

// buildRecorder builds the Kafka emitter and its connection checker when
// KAFKA_BROKERS is set.
func buildRecorder(cfg config, reg prometheus.Registerer, log *slog.Logger) (meteringParts, error) {
	if len(cfg.KafkaBrokers) == 0 {
		log.Warn("KAFKA_BROKERS is empty: metering is off, decisions are not recorded")
		return meteringParts{onHUP: func() {}, add: func(*lifecycle.Group) {}}, nil
	}
	for _, w := range cfg.Kafka.Warnings() {
		log.Warn(w)
	}
	checker, err := newKafkaChecker(cfg, reg, log)
	if err != nil {
		return meteringParts{}, err
	}
	em, err := newEmitter(cfg, checker.Refused, reg, log)
	if err != nil {
		return meteringParts{}, err
	}
	return meteringParts{
		rec: &meteringRecorder{sink: em, ids: metering.NewIDs(), instance: cfg.InstanceID},
		add: func(g *lifecycle.Group) {
			g.Add("kafka emitter", em.Run) // flushes when stopped
			g.Add("kafka checker", func(ctx context.Context) error { checker.Run(ctx); return nil })
		},
		ready: checker.Ready,
		spool: em.Spool,
		// The check re-reads the password first, and logs a change.
		onHUP: checker.Recheck,
	}, nil
}
