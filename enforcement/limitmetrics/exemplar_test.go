package limitmetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
)

// A traced decision leaves an exemplar naming its trace on the latency
// bucket it fell in; untraced decisions leave none.
func TestDecisionLatencyExemplarNamesTheTrace(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := limitmetrics.New(reg)
	d := enforcement.Decision{WouldAllow: true, Allowed: true, Policy: "p", Source: enforcement.SourceShared}
	m.Decided(enforcement.Request{Key: "k", Scope: "s"}, d, 30*time.Microsecond)
	traced := enforcement.Request{Key: "k", Scope: "s", TraceID: [16]byte{0x4b, 0xf9, 15: 0x36}}
	m.Decided(traced, d, 3*time.Millisecond) // the (2.5 ms, 5 ms] bucket

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range families {
		if f.GetName() != "limiter_decision_duration_seconds" {
			continue
		}
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			ex := b.GetExemplar()
			if ex == nil {
				continue
			}
			found++
			if b.GetUpperBound() != 5e-3 || ex.GetValue() != 3e-3 {
				t.Errorf("exemplar %v on bucket le=%g, want 0.003 on le=0.005", ex.GetValue(), b.GetUpperBound())
			}
			if l := ex.GetLabel(); len(l) != 1 || l[0].GetName() != "trace_id" || l[0].GetValue() != "4bf90000000000000000000000000036" {
				t.Errorf("exemplar labels %v, want trace_id=4bf90000000000000000000000000036", l)
			}
		}
	}
	if found != 1 {
		t.Fatalf("%d exemplars, want 1 (the traced decision's)", found)
	}
}
