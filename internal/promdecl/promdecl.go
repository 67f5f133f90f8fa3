// Package promdecl declares a Prometheus metric in one call from its name,
// help and labels, so that the packages that export metrics do not each
// repeat the Opts literal around them. It registers nothing: the caller
// registers what it declares on the registry it was given (no global
// registry). The deploy tests find a metric's name as the first argument of
// a call to this package, as they find Name: in an Opts literal.
package promdecl

import "github.com/prometheus/client_golang/prometheus"

// Counter declares a counter.
func Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec declares a counter with the given labels.
func CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge declares a gauge.
func Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec declares a gauge with the given labels.
func GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// GaugeFunc declares a gauge whose value f reads at each scrape.
func GaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
}

// Histogram declares a histogram; nil buckets are prometheus.DefBuckets.
func Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// HistogramVec declares a histogram with the given labels; nil buckets are
// prometheus.DefBuckets.
func HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
