package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// GRPCServer wraps a gRPC server's tracing stats handler (otelgrpc's) so
// that a call without a traceparent in its metadata is first put to the
// sampler's rule for a new trace (root.go), as Handler does: a call the
// sampler would drop never reaches the inner handler (no extraction of
// the metadata, no attributes, span or context of its own), and the
// inner handler sees the events only of calls with a recording span.
// A kept call's context carries the drawn trace id into the SDK's ID
// generator; only a span started as a new root inside that call (none
// is) would take it again. With tracing off it returns inner unchanged.
func (p *Provider) GRPCServer(inner stats.Handler) stats.Handler {
	if !p.Enabled() {
		return inner
	}
	return sampledStats{inner: inner, root: p.root}
}

type sampledStats struct {
	inner stats.Handler
	root  rootRule
}

func (s sampledStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	// ValueFromIncomingContext reads the one key without copying the
	// metadata (FromIncomingContext copies it all).
	if len(metadata.ValueFromIncomingContext(ctx, "traceparent")) == 0 {
		tid, keep := s.root.newRoot()
		if !keep {
			return ctx
		}
		if tid.IsValid() {
			ctx = context.WithValue(ctx, drawnKey{}, tid)
		}
	}
	return s.inner.TagRPC(ctx, info)
}

func (s sampledStats) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	if trace.SpanFromContext(ctx).IsRecording() {
		s.inner.HandleRPC(ctx, rs)
	}
}

func (s sampledStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	return s.inner.TagConn(ctx, info)
}

func (s sampledStats) HandleConn(ctx context.Context, cs stats.ConnStats) {
	s.inner.HandleConn(ctx, cs)
}
