package rlsserver

import (
	"context"
	"log/slog"
	"runtime/pprof"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The Envoy client calls of the tests (testkit/testenv).
var (
	dial = testenv.DialGRPC
	desc = testenv.Descriptor
	rls  = testenv.ShouldRateLimit
)

// serveGRPC builds the gRPC server as the limiter does and serves it in a
// goroutine carrying labels (for CPU profiles), until the returned stop.
func serveGRPC(tb testing.TB, cfg Config, lim envoyrls.Limiter, labels pprof.LabelSet) (stop func()) {
	tb.Helper()
	g, err := New(cfg, lim, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
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
