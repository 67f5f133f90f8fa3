// Package decisionevents is where enforcement meets metering in the
// limiter (neither package imports the other): Recorder turns each
// decision, settle and charge into a decision event, and Build wires it
// to the Kafka emitter, its spool and its connection checker.
package decisionevents

import (
	"context"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/policy"
)

// eventSink is what the recorder needs of the metering emitter: a call that
// never blocks a decision.
type eventSink interface {
	Emit(ev metering.Event)
}

// Recorder turns each decision into a decision event
// (enforcement.Recorder and enforcement.SettlementRecorder).
type Recorder struct {
	sink     eventSink
	ids      *metering.IDs
	instance string
	region   string // LIMITER_REGION, stamped on every event ("" = one region)
	// revision is the policy log's revision in force (log mode); nil in
	// file mode.
	revision func() int64
}

func (m *Recorder) Record(req enforcement.Request, d enforcement.Decision, at time.Time) {
	var traceID string // only sampled decisions carry one (enforcement/spans)
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
		Region:         m.region,
		Priority:       rateClass(req.Priority, d.Reason),
		Slot:           rateShed(d.Reason),
	})
}

// rateClass is the priority class a rate decision's event names: the
// request's, and for a shed request that named none the default class
// (the one that shed it). Any other request that named none names no
// class, and its event's bytes are as before classes.
func rateClass(priority, reason string) string {
	if priority == "" && reason == enforcement.ReasonShed {
		return policy.DefaultPriority
	}
	return priority
}

// rateShed marks a request its rate shed (its class's share of the bucket
// spent) with metering.SlotShed, so that the usage record counts it with
// the slots' sheds per class (slots_minute); the event stays the request's
// decision.
func rateShed(reason string) string {
	if reason == enforcement.ReasonShed {
		return metering.SlotShed
	}
	return ""
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
func (m *Recorder) RecordSettlement(s enforcement.Settlement, at time.Time) {
	m.sink.Emit(metering.Event{
		EventID:        m.ids.Next(at),
		TS:             at.UnixMilli(),
		Key:            s.Key,
		Scope:          s.Scope,
		Tier:           s.Tier,
		Domain:         s.Domain,
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
		DecidedUS:      decidedUS(s.Now),
		Region:         m.region,
	})
}

// decidedUS is the instant the store applied a settlement, µs (0 when
// unknown): a replay applies it there, in the store's order among the
// decisions of its bucket.
func decidedUS(at time.Time) int64 {
	if at.IsZero() {
		return 0
	}
	return at.UnixMicro()
}

func (m *Recorder) policyRevision() int64 {
	if m.revision == nil {
		return 0
	}
	return m.revision()
}

// Config is the metering part of the limiter's configuration.
type Config struct {
	Brokers    []string            // KAFKA_BROKERS; empty = metering off
	Topic      string              // KAFKA_TOPIC
	Security   *kafkaconn.Security // KAFKA_SASL_*, KAFKA_TLS*
	CheckEvery time.Duration       // LIMITER_KAFKA_CHECK_EVERY: between connection checks
	Buffer     int                 // LIMITER_EMIT_BUFFER
	// FlushTimeout bounds the emitter's flush at shutdown.
	FlushTimeout time.Duration
	// SpoolDir is LIMITER_SPOOL_DIR, where the emitter keeps what Kafka
	// does not take (empty = no spool: lossy); SpoolMaxBytes its budget,
	// SpoolDrainRate the events/s sent back at most.
	SpoolDir       string
	SpoolMaxBytes  int64
	SpoolDrainRate float64
	Instance       string // LIMITER_INSTANCE_ID, in every event
	Region         string // LIMITER_REGION, in every event ("" = one region)
}

// Parts is the Kafka side of the limiter: the recorder that turns
// decisions into events, and what runs and reports it.
type Parts struct {
	// Recorder is nil when metering is off (an interface: a nil one is
	// what enforcement.Config expects then).
	Recorder enforcement.Recorder
	rec      *Recorder
	ready    func() (bool, string) // nil when metering is off
	spool    func() (kafkaemit.SpoolStatus, bool)
	onHUP    func()
	add      func(g *lifecycle.Group)
}

// Build builds the Kafka emitter and its connection checker when
// KAFKA_BROKERS is set; they open nothing before they run.
func Build(cfg Config, reg prometheus.Registerer, log *slog.Logger) (Parts, error) {
	if len(cfg.Brokers) == 0 {
		log.Warn("KAFKA_BROKERS is empty: metering is off, decisions are not recorded")
		return Parts{onHUP: func() {}, add: func(*lifecycle.Group) {}}, nil
	}
	for _, w := range cfg.Security.Warnings() {
		log.Warn(w)
	}
	checker, err := newKafkaChecker(cfg, reg, log)
	if err != nil {
		return Parts{}, err
	}
	em, err := newEmitter(cfg, checker.Refused, reg, log)
	if err != nil {
		return Parts{}, err
	}
	rec := &Recorder{sink: em, ids: metering.NewIDs(), instance: cfg.Instance, region: cfg.Region}
	return Parts{
		Recorder: rec,
		rec:      rec,
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

// Add registers the emitter and its connection checker (nothing when
// metering is off).
func (p Parts) Add(g *lifecycle.Group) { p.add(g) }

// OnHUP re-reads the Kafka password (a SIGHUP action).
func (p Parts) OnHUP() { p.onHUP() }

// FollowRevision stamps each event with the policy log's revision in
// force (log mode). Call it before the limiter decides.
func (p Parts) FollowRevision(revision func() int64) {
	if p.rec != nil {
		p.rec.revision = revision
	}
}

// Status is the Kafka connection of the decision events in /readyz:
// "ok", or "failing" with the reason (a refused credential, an untrusted
// certificate, no broker): events are being spooled, or without a spool
// dropped and counted, meanwhile.
type Status struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// Spool is the state of LIMITER_SPOOL_DIR's spool; absent without one.
	Spool *SpoolReady `json:"spool,omitempty"`
}

// SpoolReady is the spool in /readyz: what it holds, how old its oldest
// event is, and how fast Kafka is taking it back.
type SpoolReady struct {
	Bytes            int64   `json:"bytes"`
	MaxBytes         int64   `json:"maxBytes"`
	Events           int64   `json:"events"`
	OldestAgeSeconds float64 `json:"oldestAgeSeconds"`
	DrainPerSecond   float64 `json:"drainPerSecond"`
	// WaitingForKafka: a Kafka write failed and none has succeeded since;
	// new events go to the spool.
	WaitingForKafka bool `json:"waitingForKafka"`
}

// Status is the metering readiness, nil when metering is off. It never
// changes the limiter's status: enforcement never waits on accounting.
func (p Parts) Status() *Status {
	if p.ready == nil {
		return nil
	}
	m := &Status{Status: "ok"}
	if ok, why := p.ready(); !ok {
		m = &Status{Status: "failing", Reason: why}
	}
	if p.spool == nil {
		return m
	}
	if st, ok := p.spool(); ok {
		m.Spool = &SpoolReady{Bytes: st.Bytes, MaxBytes: st.MaxBytes, Events: st.Events,
			OldestAgeSeconds: st.OldestAge.Seconds(), DrainPerSecond: st.DrainPerSecond, WaitingForKafka: st.WaitingForKafka}
	}
	return m
}
