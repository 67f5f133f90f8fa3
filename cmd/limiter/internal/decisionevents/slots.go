package decisionevents

import (
	"encoding/hex"

	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/metering"
)

var _ slots.Recorder = (*Recorder)(nil)

// RecordSlot implements slots.Recorder: a slot taken, refused, shed or
// released becomes a decision event carrying Slot, Priority and InFlight.
//
// The rule that keeps a request counted once (requests, allowed,
// rejected, cost, in the usage rollups and so in quotas and billing):
// a request is counted by the first decision recorded for it. On a limit
// with a rate that is the rate's decision, recorded before the slot is
// asked for, so the slot's event is metering.KindSlot: no request, no
// cost, no remaining or limit (the rate's are in its decision). On a
// limit that is a concurrency alone the slot's decision is the request's
// only one: its event is a decision like any other, allowed or rejected
// as answered, with its cost. A release is never a request.
func (m *Recorder) RecordSlot(ev slots.Event) {
	d, req := ev.Decision, ev.Request
	e := metering.Event{
		EventID:        m.ids.Next(ev.At),
		TS:             ev.At.UnixMilli(),
		Key:            req.Key,
		Scope:          req.Scope,
		Tier:           d.Tier,
		Allowed:        d.Allowed,
		Source:         d.Source.String(),
		Policy:         d.Policy,
		DryRun:         d.DryRun,
		Instance:       m.instance,
		Domain:         req.Domain,
		PolicyRevision: m.policyRevision(),
		Region:         m.region,
		Slot:           ev.Outcome,
		Priority:       ev.Priority,
		InFlight:       ev.InFlight,
	}
	if req.TraceID != ([16]byte{}) {
		e.TraceID = hex.EncodeToString(req.TraceID[:])
	}
	switch {
	case ev.Outcome == slots.OutcomeReleased:
		e.Kind, e.Allowed = metering.KindSlot, true
	case ev.IsRequest:
		e.Cost, e.Remaining, e.Limit = uint64(max(0, d.Cost)), d.Remaining, d.Limit
	default:
		e.Kind = metering.KindSlot
	}
	m.sink.Emit(e)
}

// SlotRecorder is the recorder of slot decisions; nil when metering is
// off.
func (p Parts) SlotRecorder() slots.Recorder {
	if p.rec == nil {
		return nil
	}
	return p.rec
}
