package slots

import (
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Outcomes of a slot decision (Event.Outcome).
const (
	OutcomeTaken    = "taken"    // a slot was given (its lease is in Decision)
	OutcomeRefused  = "refused"  // every slot is held (enforcement.ReasonConcurrency)
	OutcomeShed     = "shed"     // the class's share is held (enforcement.ReasonShed)
	OutcomeReleased = "released" // a release freed a held slot
)

// defaultClass is the class of a request that names none.
const defaultClass = "default"

// Event is one slot decision, as the Gate tells its Recorder.
type Event struct {
	// Request is the request decided (for a release: its key and scope).
	Request enforcement.Request
	// Decision is the answer given; for a release, allowed, with the
	// source of the set that held the slot.
	Decision enforcement.Decision
	Outcome  string
	// Priority is the request's class ("default" when it named none); ""
	// for a release.
	Priority string
	// InFlight is the slots of the key and scope held just after the
	// call, as the store counted them (the in-process set's count for a
	// degraded decision); 0 for a release.
	InFlight int64
	// IsRequest: the slot decision is the request's only decision (its
	// limit is a concurrency alone). Otherwise the request was decided,
	// and recorded, by its rate first: this event is no request.
	IsRequest bool
	// At is the limiter's clock when the slot was asked for or given back.
	At time.Time
}

// Recorder records slot decisions (cmd/limiter/internal/decisionevents
// makes them decision events). Implementations are safe for concurrent
// use and never block: the decision waits for RecordSlot.
type Recorder interface {
	RecordSlot(ev Event)
}

// outcomeOf is a grant's outcome.
func outcomeOf(gr Grant) string {
	switch {
	case gr.Admitted:
		return OutcomeTaken
	case gr.Reason == enforcement.ReasonShed:
		return OutcomeShed
	}
	return OutcomeRefused
}

// recordSlot tells the Recorder, if any, of an acquire's outcome.
func (g *Gate) recordSlot(req enforcement.Request, d enforcement.Decision, gr Grant, class string, alone bool, at time.Time) {
	if g.cfg.Recorder == nil {
		return
	}
	if class == "" {
		class = defaultClass
	}
	g.cfg.Recorder.RecordSlot(Event{Request: req, Decision: d, Outcome: outcomeOf(gr), Priority: class,
		InFlight: gr.Held, IsRequest: alone, At: at})
}

// recordRelease tells the Recorder, if any, of a slot given back.
func (g *Gate) recordRelease(s Slot, at time.Time) {
	if g.cfg.Recorder == nil {
		return
	}
	d := enforcement.Decision{Allowed: true, WouldAllow: true, Source: enforcement.SourceShared}
	if s.Degraded {
		d.Source = enforcement.SourceDegraded
	}
	g.cfg.Recorder.RecordSlot(Event{Request: enforcement.Request{Key: s.Key, Scope: s.Scope},
		Decision: d, Outcome: OutcomeReleased, At: at})
}
