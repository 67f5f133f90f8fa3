package limitmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/slots"
)

// Slots counts what the concurrency limits do (package enforcement/slots).
// It implements slots.Observer and is safe for concurrent use. Label
// values are bounded: priorities are the policy's classes (an unknown one
// is refused before it is counted), outcomes a fixed set.
type Slots struct {
	decisions *prometheus.CounterVec
	returns   *prometheus.CounterVec
}

var _ slots.Observer = (*Slots)(nil)

// NewSlots registers on reg limiter_slot_decisions_total{outcome=
// "admitted|concurrency|shed", priority, source="shared|local|degraded"} and
// limiter_slot_returns_total{outcome="released|unheld|renewed|lost"}.
func NewSlots(reg prometheus.Registerer) *Slots {
	s := &Slots{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiter_slot_decisions_total",
			Help: "Slot acquisitions on concurrency limits: admitted, or refused for want of a slot (concurrency) or because the priority class holds its share (shed); and the rate decisions of a class below share 1 (admitted, or shed by its floor in the bucket); by class and by who decided (shared: the store; local: a refusal in process on the store's last refusal, with no store call; degraded: this instance's tightened set while the store could not be asked).",
		}, []string{"outcome", "priority", "source"}),
		returns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiter_slot_returns_total",
			Help: "Slot releases and renewals: released (a slot freed), unheld (a release that freed nothing: released before, or its lease ended), renewed, lost (a renewal of a lease that had ended).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(s.decisions, s.returns)
	return s
}

// Slot implements slots.Observer.
func (s *Slots) Slot(outcome, priority string, source enforcement.Source) {
	if priority == "" {
		priority = "default"
	}
	s.decisions.WithLabelValues(outcome, priority, source.String()).Inc()
}

// Return implements slots.Observer.
func (s *Slots) Return(outcome string) { s.returns.WithLabelValues(outcome).Inc() }
