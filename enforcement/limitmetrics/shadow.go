package limitmetrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement/shadow"
	"github.com/ratewarden/ratewarden/internal/promdecl"
)

// Shadow counts shadow-limit verdicts (package enforcement/shadow). It
// implements shadow.Observer and is safe for concurrent use. Label values
// are bounded: shadow names come from the policy file, reasons are a
// fixed set.
type Shadow struct {
	decisions   *prometheus.CounterVec
	unavailable *prometheus.CounterVec
	byName      sync.Map // shadow name → *[2][2]prometheus.Counter [shadow allows][enforced allowed]
}

var _ shadow.Observer = (*Shadow)(nil)

// NewShadow registers the shadow metrics on reg:
// limiter_shadow_decisions_total{shadow, outcome="allowed|would_reject",
// enforced="allowed|rejected"} (enforced: what the caller was answered, so
// outcome="would_reject",enforced="allowed" is what enforcing the shadow
// limit would newly reject) and limiter_shadow_unavailable_total{reason="store|error"}.
func NewShadow(reg prometheus.Registerer) *Shadow {
	s := &Shadow{
		decisions:   promdecl.CounterVec("limiter_shadow_decisions_total", "Shadow-limit verdicts per shadow rule (evaluated beside enforcement, never enforced): allowed or would_reject, by what enforcement answered the same decision (enforced=allowed|rejected).", "shadow", "outcome", "enforced"),
		unavailable: promdecl.CounterVec("limiter_shadow_unavailable_total", "Decisions a shadow limit applied to but could not decide (store: the shadow store failed or its breaker is open; error): they carry no shadow verdict.", "reason"),
	}
	reg.MustRegister(s.decisions, s.unavailable)
	for _, r := range []string{"store", "error"} {
		s.unavailable.WithLabelValues(r)
	}
	return s
}

// Evaluated implements shadow.Observer.
func (s *Shadow) Evaluated(name string, wouldAllow, allowed bool) {
	c := s.counters(name)
	c[b2i(wouldAllow)][b2i(allowed)].Inc()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Unavailable implements shadow.Observer.
func (s *Shadow) Unavailable(reason string) { s.unavailable.WithLabelValues(reason).Inc() }

func (s *Shadow) counters(name string) *[2][2]prometheus.Counter {
	if v, ok := s.byName.Load(name); ok {
		return v.(*[2][2]prometheus.Counter)
	}
	c := &[2][2]prometheus.Counter{}
	for i, outcome := range []string{"would_reject", "allowed"} {
		for j, enforced := range []string{"rejected", "allowed"} {
			c[i][j] = s.decisions.WithLabelValues(name, outcome, enforced)
		}
	}
	v, _ := s.byName.LoadOrStore(name, c)
	return v.(*[2][2]prometheus.Counter)
}
