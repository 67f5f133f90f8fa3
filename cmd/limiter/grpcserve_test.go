package main

import (
	"context"
	"log/slog"
	"runtime/pprof"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// serveGRPC builds the gRPC server as run does and serves it in a
// goroutine carrying labels (for CPU profiles), until the returned stop.
func serveGRPC(tb testing.TB, cfg config, lim checker, labels pprof.LabelSet) (stop func()) {
	tb.Helper()
	g, err := newGRPC(cfg, lim, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	served := make(chan error, 1)
	go pprof.Do(context.Background(), labels, func(context.Context) { served <- g.Serve() })
	return func() {
		_ = g.Shutdown(context.Background())
		if err := <-served; err != nil {
			tb.Error(err)
		}
	}
}
