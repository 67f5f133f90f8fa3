// Package metering is the accounting side of the product: the decision event
// that every rate-limit decision becomes, and (in subpackages) what carries it
// to Kafka and rolls it into ClickHouse. It depends on the standard library
// and internal/jsonstr only, never on enforcement (deploy/archtest holds
// both): cmd/limiter/internal/decisionevents turns a decision into an Event.
package metering

import (
	"encoding/json"
	"errors"
	"fmt"
)

// DefaultTopic is the decisions topic's name unless KAFKA_TOPIC says
// otherwise: the limiter publishes there, the meter-consumer and the
// notifier read it.
const DefaultTopic = "ratelimit.decisions"

// EventVersion is the version of the encoding written in the "v" field.
// Decoders accept every version up to this one.
const EventVersion = 1

// Event is one rate-limit decision, as published on the decisions topic
// (message key = Key, so one key's events stay ordered in one partition).
type Event struct {
	EventID   string `json:"event_id"` // unique and time-ordered (see NewEventID)
	TS        int64  `json:"ts"`       // decision time, ms since the Unix epoch
	Key       string `json:"key"`
	Scope     string `json:"scope"`
	Tier      string `json:"tier"`
	Cost      uint64 `json:"cost"`
	Allowed   bool   `json:"allowed"`
	Source    string `json:"source"` // local | shared | degraded
	Remaining int64  `json:"remaining"`
	Limit     int64  `json:"limit"`
	Policy    string `json:"policy"`
	DryRun    bool   `json:"dry_run"`
	Warning   bool   `json:"warning"`
	Instance  string `json:"instance"`
	// Domain is the Envoy rate limit domain of a decision made through the
	// gRPC rate limit service; absent for /check. Added within version 1:
	// decoders that do not know it ignore it.
	Domain string `json:"domain,omitempty"`
	// Shadow names the shadow limit evaluated beside this decision (a rule
	// marked shadow, or the candidate policy's rule); absent when none
	// applied. ShadowRejected: that limit would have rejected the decision
	// (absent = it would have allowed it). Never enforced. Added within
	// version 1: decoders that do not know them ignore them.
	Shadow         string `json:"shadow,omitempty"`
	ShadowRejected bool   `json:"shadow_rejected,omitempty"`
	// PolicyRevision is the revision of the policy log in force when the
	// decision was recorded (a decision racing a swap may carry the next
	// one); absent when the limiter reads its policy from a file. Added
	// within version 1: decoders that do not know it ignore it.
	PolicyRevision int64 `json:"policy_revision,omitempty"`
	// TraceID is the W3C trace id (32 lowercase hex digits) of the sampled
	// trace the decision was made in; absent when it was not traced
	// (docs/tracing.md). Added within version 1: decoders that do not know
	// it ignore it.
	TraceID string `json:"trace_id,omitempty"`
	// DecidedUS is, for a shared decision, the instant the store decided
	// (Redis TIME), µs since the Unix epoch, and for a settle or a charge
	// the instant the store applied it; absent otherwise. TS is the
	// limiter's clock before the store call; a replay decides at this
	// instant instead. Added within version 1: decoders that do not know
	// it ignore it.
	DecidedUS int64 `json:"decided_us,omitempty"`
	// ShadowRevision is the policy log's revision of the rollout whose
	// candidate gave the shadow verdict (Shadow, ShadowRejected); absent
	// for a shadow rule or a candidate file. Added within version 1:
	// decoders that do not know it ignore it.
	ShadowRevision int64 `json:"shadow_revision,omitempty"`
	// Kind is what the event records: KindDecision (absent: every event
	// written before kinds existed is a decision), KindSettle (a
	// reservation's actual cost charged) or KindCharge (a cost charged
	// after the fact). A settle or a charge is not a request: its Cost is
	// 0 and Allowed true; its costs are Estimate and Actual. Added within
	// version 1: decoders that do not know it ignore it.
	Kind string `json:"kind,omitempty"`
	// Reservation is the reservation id of a reserving decision and of its
	// settle; absent otherwise. Added within version 1.
	Reservation string `json:"reservation,omitempty"`
	// Estimate is what a settled reservation had spent (its decision's
	// Cost); Actual the actual cost a settle or a charge charged. The
	// actual cost of a key is its allowed decisions' Cost, plus Actual −
	// Estimate over its settles, plus its charges' Actual; a reservation
	// that expired unsettled costs its estimate. Absent when 0. Added
	// within version 1.
	Estimate uint64 `json:"estimate,omitempty"`
	Actual   uint64 `json:"actual,omitempty"`
	// ReservedTS is, for a settle, its reservation's decision time (that
	// event's TS, ms): the rollups count the settle's actual − estimate in
	// the reservation's own minute, where its estimate was counted. Added
	// within version 1.
	ReservedTS int64 `json:"reserved_ts,omitempty"`
	// Region is the region of the limiter that decided (its
	// LIMITER_REGION); absent in a one-region deployment, whose events'
	// bytes are as before. A global key's usage is the sum over regions.
	// Added within version 1: decoders that do not know it ignore it.
	Region string `json:"region,omitempty"`
	// Requests and Rejected are, for a correction (KindCorrection), its
	// signed change of the key's requests and of its rejected requests in
	// the bucket of TS (its allowed ones change by Requests − Rejected);
	// its change of cost is Actual − Estimate, as for a settle. Absent
	// otherwise. Added within version 1: decoders that do not know them
	// ignore them.
	Requests int64 `json:"requests,omitempty"`
	Rejected int64 `json:"rejected,omitempty"`
	// Slot is what a slot decision did on a concurrency limit (docs/
	// concurrency.md): SlotTaken, SlotRefused (every slot held), SlotShed
	// (the priority class's share held) or SlotReleased; absent for an
	// event that is no slot decision, except a rate's decision its class's
	// floor shed, which carries SlotShed. Priority is the request's class
	// ("default" when it named none; on a rate's decision, absent when it
	// named none and was not shed) and InFlight the slots of the key and
	// scope held just after the call, as the store counted them (the
	// limiter's own in-process set for a degraded decision; absent for a
	// release and a rate's decision). Added within version 1: decoders
	// that do not know them ignore them.
	//
	// A request is counted once (requests, allowed, rejected, cost): by
	// its rate's decision when its limit has a rate, then its slot's event
	// is KindSlot and no request; by its slot's decision when the limit is
	// a concurrency alone, then the event is a decision (Kind absent) that
	// carries Slot. A release is always KindSlot.
	Slot     string `json:"slot,omitempty"`
	Priority string `json:"priority,omitempty"`
	InFlight int64  `json:"in_flight,omitempty"`
}

// Slot outcomes (Event.Slot).
const (
	SlotTaken    = "taken"
	SlotRefused  = "refused"
	SlotShed     = "shed"
	SlotReleased = "released"
)

// Event kinds (Event.Kind).
const (
	KindDecision = "decision"
	KindSettle   = "settle"
	KindCharge   = "charge"
	// KindReset is a support reset of the key's calendar quota (`limiter
	// key reset --quota`, docs/support.md): not a request and no cost
	// (Cost, Estimate and Actual are 0), so totals are unchanged; it marks
	// in the key's usage history where its quota count went back to zero.
	// Reservation is the reset's id, the id of its audit record; Limit the
	// quota limit and Remaining what is left of it after (all of it).
	KindReset = "reset"
	// KindCorrection is an operator's correction of a key's usage (a void,
	// a credit or a debit: metering/billing), counted by the pipeline like
	// any event and never an edit of the raw record. Its Tier is
	// "correction:<id>", so the rollups keep it apart from the usage it
	// corrects.
	KindCorrection = "correction"
	// KindSlot is a slot decision that is not a request: the slot asked
	// for by a request whose rate's decision already counted it, or a
	// slot given back (Event.Slot). Cost 0; counted only in the slot
	// rollup.
	KindSlot = "slot"
)

// IsDecision reports whether e records a decision (a request), not a
// settle or a charge.
func (e *Event) IsDecision() bool { return e.Kind == "" || e.Kind == KindDecision }

type wireEvent struct {
	V int `json:"v"`
	Event
}

// Encode returns the version-1 JSON encoding of e.
func (e *Event) Encode() ([]byte, error) {
	return json.Marshal(wireEvent{V: EventVersion, Event: *e})
}

// ErrBadEvent marks a message that is not a decodable decision event.
var ErrBadEvent = errors.New("bad decision event")

// Decode parses an encoded event and checks the fields every consumer relies on.
func Decode(b []byte) (Event, error) {
	var w wireEvent
	if err := json.Unmarshal(b, &w); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrBadEvent, err)
	}
	if w.V < 1 || w.V > EventVersion {
		return Event{}, fmt.Errorf("%w: unsupported version %d", ErrBadEvent, w.V)
	}
	if w.EventID == "" || w.Key == "" || w.Scope == "" || w.TS <= 0 {
		return Event{}, fmt.Errorf("%w: event_id, key, scope and ts are required", ErrBadEvent)
	}
	return w.Event, nil
}
