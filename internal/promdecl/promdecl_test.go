package promdecl

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestDeclared: what each call declares carries the name, help, labels and
// buckets it was given, as a registry exposes them.
func TestDeclared(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := Counter("a_total", "A.")
	cv := CounterVec("b_total", "B.", "x", "y")
	g := Gauge("c", "C.")
	gv := GaugeVec("d", "D.", "z")
	gf := GaugeFunc("e", "E.", func() float64 { return 7 })
	h := Histogram("f_seconds", "F.", []float64{1, 2})
	hv := HistogramVec("g_seconds", "G.", nil, "w")
	reg.MustRegister(c, cv, g, gv, gf, h, hv)
	c.Inc()
	cv.WithLabelValues("1", "2").Add(3)
	g.Set(4)
	gv.WithLabelValues("5").Set(6)
	h.Observe(1.5)
	hv.WithLabelValues("8").Observe(0.3)
	want := `
# HELP a_total A.
# TYPE a_total counter
a_total 1
# HELP b_total B.
# TYPE b_total counter
b_total{x="1",y="2"} 3
# HELP c C.
# TYPE c gauge
c 4
# HELP d D.
# TYPE d gauge
d{z="5"} 6
# HELP e E.
# TYPE e gauge
e 7
# HELP f_seconds F.
# TYPE f_seconds histogram
f_seconds_bucket{le="1"} 0
f_seconds_bucket{le="2"} 1
f_seconds_bucket{le="+Inf"} 1
f_seconds_sum 1.5
f_seconds_count 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "a_total", "b_total", "c", "d", "e", "f_seconds"); err != nil {
		t.Error(err)
	}
	// nil buckets are the default ones.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "g_seconds" {
			continue
		}
		m := mf.GetMetric()[0]
		if got := len(m.GetHistogram().GetBucket()); got != len(prometheus.DefBuckets) {
			t.Errorf("g_seconds has %d buckets, want the %d default ones", got, len(prometheus.DefBuckets))
		}
		if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "w" || l[0].GetValue() != "8" {
			t.Errorf("g_seconds labels %v, want w=8", l)
		}
		return
	}
	t.Error("g_seconds not gathered")
}
