package tracing

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

// rootRule is the configured sampler's verdict on a new trace (a request
// that carries no traceparent), known before any span is built: the
// decision path asks it first and, when the SDK's sampler would drop the
// trace, serves the request without calling the tracer at all (no span,
// no context, no ID beyond the one drawn here). When it would sample, the
// trace id drawn here is handed to the SDK (idGenerator), whose own
// sampler then decides on that same id, and so agrees. The rule is the
// SDK's, restated: TraceIDRatioBased samples a trace when the last 8
// bytes of its id, big-endian and shifted right by one, are below
// fraction × 2^63 (TestRootRuleAgreesWithTheSDK holds the two together).
type rootRule struct {
	kind  rootKind
	bound uint64 // ratio: the SDK's traceIDUpperBound
}

type rootKind uint8

const (
	rootAlways rootKind = iota // always_on, parentbased_always_on
	rootNever                  // always_off, parentbased_always_off
	rootRatio                  // traceidratio, parentbased_traceidratio
)

// ratioRule is the rule of sdktrace.TraceIDRatioBased(fraction).
func ratioRule(fraction float64) rootRule {
	switch {
	case fraction >= 1:
		return rootRule{kind: rootAlways}
	case fraction <= 0:
		return rootRule{kind: rootNever}
	}
	return rootRule{kind: rootRatio, bound: uint64(fraction * (1 << 63))}
}

// newRoot draws the trace id of a new trace and reports whether the
// sampler keeps it.
func (r rootRule) newRoot() (trace.TraceID, bool) {
	switch r.kind {
	case rootNever:
		return trace.TraceID{}, false
	case rootAlways:
		return trace.TraceID{}, true // the SDK draws the id
	}
	tid := newTraceID()
	return tid, r.keeps(tid)
}

// keeps is the ratio rule's verdict on tid.
func (r rootRule) keeps(tid trace.TraceID) bool {
	switch r.kind {
	case rootNever:
		return false
	case rootAlways:
		return true
	}
	return binary.BigEndian.Uint64(tid[8:16])>>1 < r.bound
}

// newTraceID is a random, valid (non-zero) trace id, drawn as the SDK's
// default generator draws it.
func newTraceID() trace.TraceID {
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid
}

// drawnKey carries a trace id drawn by rootRule into the tracer's Start.
type drawnKey struct{}

// idGenerator is the SDK's default random generator, except that a new
// trace takes the id rootRule drew for it, when there is one.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	tid, ok := ctx.Value(drawnKey{}).(trace.TraceID)
	if !ok {
		tid = newTraceID()
	}
	return tid, newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}
