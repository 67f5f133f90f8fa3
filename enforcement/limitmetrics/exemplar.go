package limitmetrics

import (
	"encoding/hex"

	"github.com/prometheus/client_golang/prometheus"
)

// observeTraced observes v with an exemplar naming the trace (the
// OpenMetrics exposition shows, per bucket, the latest one), so that a
// slow bucket links to a trace of a decision that fell in it. Only sampled
// decisions carry a trace id, so this runs at the sampling rate.
func observeTraced(h prometheus.Histogram, v float64, traceID [16]byte) {
	eo, ok := h.(prometheus.ExemplarObserver)
	if !ok {
		h.Observe(v)
		return
	}
	eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": hex.EncodeToString(traceID[:])})
}
