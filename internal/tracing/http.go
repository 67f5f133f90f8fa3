package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Handler serves h inside a server span named route (e.g. "POST /check";
// "" names it by the method alone, for a handler whose routes are its
// own), child of the W3C traceparent the request carries, if any. When
// tracing is off it returns h itself: nothing is added to a request.
//
// It is kept smaller than otelhttp on purpose, for the decision path: a
// request without a traceparent is first put to the sampler's rule for a
// new trace (root.go), and one the sampler would drop is served as is,
// without calling the tracer: no span, no context, no allocation. A
// request with a traceparent goes through the propagator and the SDK's
// sampler; if that drops it, it is served with its own *http.Request
// (nothing downstream of the limiter would use the span's context: it
// makes no child span and propagates nothing). The ResponseWriter is
// wrapped (for the status code) only when the request is sampled.
func (p *Provider) Handler(route string, h http.Handler) http.Handler {
	if !p.Enabled() {
		return h
	}
	tracer, prop, root := p.tracer, p.prop, p.root
	// Built once: an option, and the variadic slice of a call through an
	// interface, are each an allocation.
	server := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		name := route
		if name == "" {
			name = r.Method
		}
		var span trace.Span
		// net/http canonicalises incoming header names: a map lookup finds
		// the field without the allocation of Header.Get's canonicalising.
		if _, ok := r.Header["Traceparent"]; ok {
			ctx, span = tracer.Start(prop.Extract(ctx, propagation.HeaderCarrier(r.Header)), name, server...)
		} else if tid, keep := root.newRoot(); !keep {
			h.ServeHTTP(w, r)
			return
		} else if tid.IsValid() {
			// The SDK takes the drawn id (idGenerator) and samples it again,
			// with the same verdict; the request's context does not carry
			// the drawn id further.
			_, span = tracer.Start(context.WithValue(ctx, drawnKey{}, tid), name, server...)
			ctx = trace.ContextWithSpan(ctx, span)
		} else {
			ctx, span = tracer.Start(ctx, name, server...)
		}
		if !span.IsRecording() {
			h.ServeHTTP(w, r)
			span.End()
			return
		}
		span.SetAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path))
		if route != "" {
			span.SetAttributes(semconv.HTTPRoute(route))
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(semconv.HTTPResponseStatusCode(sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
		span.End()
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushing, deadlines) through the wrapper.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
