// Package spans is the limiter's tracing of its decisions
// (docs/tracing.md): decorators of the limiter and of the shared tier
// that record spans inside sampled requests, and the gRPC server's stats
// handler. With tracing off each returns what it was given, untouched.
package spans

import (
	"context"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/tracing"
)

// The limiter's spans (docs/tracing.md), under the transport's server span
// ("POST /check", or otelgrpc's for ShouldRateLimit):
//
//   - ratewarden.decide, one per decision, with what was decided: scope,
//     tier, policy, source, allowed, cost. Never the key: keys are account
//     ids, API keys or client addresses, secrets or personal data that a
//     tracing backend must not receive.
//   - ratewarden.store.take, one per call to the shared store, with the
//     store's kind and the size of the auto-pipelined batch it rode in.
//
// Both exist only inside a sampled (recording) span: an unsampled decision
// skips them with one check, and with tracing off nothing here is wired in.
const (
	attrScope     = attribute.Key("ratewarden.scope")
	attrTier      = attribute.Key("ratewarden.tier")
	attrPolicy    = attribute.Key("ratewarden.policy")
	attrSource    = attribute.Key("ratewarden.source")
	attrAllowed   = attribute.Key("ratewarden.allowed")
	attrCost      = attribute.Key("ratewarden.cost")
	attrDryRun    = attribute.Key("ratewarden.dry_run")
	attrDomain    = attribute.Key("ratewarden.domain")
	attrStore     = attribute.Key("ratewarden.store")
	attrBatch     = attribute.Key("ratewarden.store.batch_size")
	attrInProcess = attribute.Key("ratewarden.store.in_process")
)

// Checker is what the transports ask for decisions (httpapi.Checker and
// envoyrls.Limiter are subsets of it).
type Checker interface {
	Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error)
	Policy() enforcement.Policy
}

// tracedChecker records each decision made inside a sampled span as a
// child span, and hands the trace id to the decision (Request.TraceID),
// whence it reaches the decision event and the latency exemplar.
type tracedChecker struct {
	*enforcement.Limiter
	tracer trace.Tracer
}

func (c tracedChecker) Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return c.Limiter.Check(ctx, req)
	}
	ctx, span := c.tracer.Start(ctx, "ratewarden.decide")
	if sc := span.SpanContext(); sc.IsSampled() {
		req.TraceID = sc.TraceID()
	}
	d, err := c.Limiter.Check(ctx, req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "no decision")
	} else {
		span.SetAttributes(attrScope.String(req.Scope), attrTier.String(d.Tier), attrPolicy.String(d.Policy),
			attrSource.String(d.Source.String()), attrAllowed.Bool(d.Allowed), attrCost.Int64(d.Cost), attrDryRun.Bool(d.DryRun))
		if req.Domain != "" {
			span.SetAttributes(attrDomain.String(req.Domain))
		}
	}
	span.End()
	return d, err
}

// clientKind is built once: an option, and the variadic slice of a call
// through an interface, are each an allocation.
var clientKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// tracedAuthority is the shared tier with a span per store call made
// inside a sampled span.
type tracedAuthority struct {
	enforcement.Authority
	tracer trace.Tracer
	kind   string // memory, redis, redis-cluster, redis-sentinel
}

func (a tracedAuthority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return a.Authority.Take(ctx, key, scope, lim, cost)
	}
	ctx, span := a.tracer.Start(ctx, "ratewarden.store.take", clientKind...)
	var batch redisstore.BatchReport
	v, err := a.Authority.Take(redisstore.WithBatchReport(ctx, &batch), key, scope, lim, cost)
	span.SetAttributes(attrStore.String(a.kind), attrInProcess.Bool(v.InProcess))
	if a.kind != "memory" {
		span.SetAttributes(semconv.DBSystemNameRedis)
	}
	if batch.Size > 0 {
		span.SetAttributes(attrBatch.Int(batch.Size))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "store call failed")
	} else {
		span.SetAttributes(attrAllowed.Bool(v.Allowed))
	}
	span.End()
	return v, err
}

// Authority is auth with a span per store call when tracing is on; kind
// is the store's (sharedtier.Tier.Kind).
func Authority(tr *tracing.Provider, auth enforcement.Authority, kind string) enforcement.Authority {
	if !tr.Enabled() {
		return auth
	}
	return tracedAuthority{Authority: auth, tracer: tr.Tracer(), kind: kind}
}

// Check is lim with a span per decision when tracing is on.
func Check(tr *tracing.Provider, lim *enforcement.Limiter) Checker {
	if !tr.Enabled() {
		return lim
	}
	return tracedChecker{Limiter: lim, tracer: tr.Tracer()}
}

// GRPC is the gRPC server's stats handler (otelgrpc): a server span
// per sampled call, child of the traceparent in the call's metadata; a
// call without one that the sampler drops skips otelgrpc (GRPCServer).
// None when tracing is off. Its metrics go to a no-op meter: the
// limiter's gRPC metrics are its own Prometheus series.
func GRPC(tr *tracing.Provider) []grpc.ServerOption {
	if tr == nil || !tr.Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(tr.GRPCServer(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tr.TracerProvider()),
		otelgrpc.WithPropagators(tr.Propagator()),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
	)))}
}
