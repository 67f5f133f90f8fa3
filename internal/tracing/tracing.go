// Package tracing is the binaries' OpenTelemetry setup: one Provider per
// process, configured only by the standard OTEL_* variables, exporting
// over OTLP with the official SDK and exporters (docs/tracing.md).
//
// Off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// is set (and OTEL_SDK_DISABLED is not true): the Provider is then the
// API's no-op, Handler and the binaries' wrappers return what they wrap,
// and a decision pays nothing for tracing.
//
// Lifecycle: New starts nothing (no goroutine, no connection). The SDK's
// batch processor, and the exporter under it, start with the first sampled
// span that ends; Shutdown flushes what is queued and stops them, and is
// the last step of a binary's shutdown, after its servers have drained (so
// the spans of the last requests are in the flush).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ratewarden/ratewarden/internal/envconfig"
)

// Scope is the instrumentation scope of the product's spans.
const Scope = "github.com/ratewarden/ratewarden"

// The variables read here. The exporters read their own (endpoint,
// headers, timeout, compression, TLS: the OTEL_EXPORTER_OTLP_* family) and
// the resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, all
// from the process environment.
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSampler        = "OTEL_TRACES_SAMPLER"
	envSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
	envDisabled       = "OTEL_SDK_DISABLED"
)

// Provider is a process's tracing: a TracerProvider and the W3C
// propagator. The zero value is not usable; New returns one. Safe for
// concurrent use.
type Provider struct {
	tp     trace.TracerProvider
	sdk    *sdktrace.TracerProvider // nil when off
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	lazy   *lazyProcessor // nil when off
	proto  string         // "http/protobuf" or "grpc"; "" when off
	root   rootRule       // the sampler's verdict on a new trace (root.go)
}

// New reads the tracing variables through getenv (os.Getenv in the
// binaries) and returns the Provider of a process whose default service
// name is service (OTEL_SERVICE_NAME overrides it). Every bad value is
// reported at once; the binaries find them earlier, with the rest of
// their configuration (Check). It starts nothing.
func New(getenv func(string) string, service string) (*Provider, error) {
	prop := propagation.TraceContext{}
	off := &Provider{tp: noop.NewTracerProvider(), prop: prop}
	off.tracer = off.tp.Tracer(Scope)
	st, problems := read(getenv)
	if len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = p
		}
		return nil, errors.Join(errs...)
	}
	if st.disabled || st.endpoint == "" {
		return off, nil
	}
	res, err := newResource(service)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envResource, err)
	}
	protocol := st.protocol
	lazy := &lazyProcessor{newExporter: func() (sdktrace.SpanExporter, error) { return newExporter(protocol) }}
	sdk := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(st.sampler),
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(lazy),
		sdktrace.WithIDGenerator(idGenerator{}),
	)
	return &Provider{tp: sdk, sdk: sdk, tracer: sdk.Tracer(Scope), prop: prop, lazy: lazy, proto: protocol, root: st.root}, nil
}

// envResource is the resource's variable (read by the SDK, from the
// process environment, with OTEL_SERVICE_NAME).
const envResource = "OTEL_RESOURCE_ATTRIBUTES"

func newResource(service string) (*resource.Resource, error) {
	return resource.New(context.Background(),
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME: after, so they win
		resource.WithTelemetrySDK(),
	)
}

// Problem is a bad value of one tracing variable.
type Problem struct {
	Var, Value, Want string
}

func (p Problem) Error() string { return fmt.Sprintf("%s=%q: want %s", p.Var, p.Value, p.Want) }

// Check reports every bad value of the tracing variables: those New reads
// through getenv, the exporters' timeouts, compression and headers (which
// the SDK would otherwise log and replace at the first span), and
// OTEL_RESOURCE_ATTRIBUTES (read by the SDK from the process environment).
// A binary calls it while reading its configuration, so that a bad OTEL_*
// value stops it with the others, before anything starts.
func Check(getenv func(string) string) []Problem {
	_, problems := read(getenv)
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
				problems = append(problems, Problem{name, v, "a number of milliseconds ≥ 0"})
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"} {
		if v := strings.TrimSpace(getenv(name)); v != "" && v != "gzip" && v != "none" {
			problems = append(problems, Problem{name, v, "gzip or none"})
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		if v := strings.TrimSpace(getenv(name)); v != "" && !validPairs(v) {
			// The value is not repeated: headers carry credentials.
			problems = append(problems, Problem{name, "…", "key=value pairs separated by commas"})
		}
	}
	if v := getenv(envResource); strings.TrimSpace(v) != "" {
		if _, err := newResource(""); err != nil {
			problems = append(problems, Problem{envResource, v, "key=value pairs separated by commas (values percent-encoded)"})
		}
	}
	return problems
}

// CheckConfig records Check's problems on e (a binary's configuration
// reader), each naming its variable.
func CheckConfig(e *envconfig.Reader) {
	for _, p := range Check(e.Raw) {
		e.Fail(p.Var, "%q: want %s", p.Value, p.Want)
	}
}

// validPairs reports whether v is key=value[,key=value...] with
// non-empty keys, as the OTLP exporters parse their headers.
func validPairs(v string) bool {
	for _, pair := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return false
		}
		if _, err := url.QueryUnescape(val); err != nil {
			return false
		}
	}
	return true
}

// settings are the tracing variables New reads itself.
type settings struct {
	disabled bool
	endpoint string
	protocol string
	sampler  sdktrace.Sampler
	root     rootRule
}

func read(getenv func(string) string) (settings, []Problem) {
	var st settings
	var problems []Problem
	if v := strings.TrimSpace(getenv(envDisabled)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			problems = append(problems, Problem{envDisabled, v, "true or false"})
		}
		st.disabled = b
	}
	st.endpoint = strings.TrimSpace(getenv(envTracesEndpoint))
	endpointVar := envTracesEndpoint
	if st.endpoint == "" {
		st.endpoint, endpointVar = strings.TrimSpace(getenv(envEndpoint)), envEndpoint
	}
	var err error
	var p Problem
	if st.protocol, err = protocolFrom(getenv); errors.As(err, &p) {
		problems = append(problems, p)
	}
	if st.sampler, st.root, err = samplerFrom(getenv); errors.As(err, &p) {
		problems = append(problems, p)
	}
	if st.endpoint != "" {
		if u, err := url.Parse(st.endpoint); err != nil || u.Host == "" {
			problems = append(problems, Problem{endpointVar, st.endpoint, "a URL such as http://127.0.0.1:4318"})
		}
	}
	return st, problems
}

// Enabled reports whether spans are exported (an endpoint is set).
func (p *Provider) Enabled() bool { return p.sdk != nil }

// Protocol is the OTLP protocol spans are exported with, "http/protobuf"
// or "grpc"; "" when tracing is off.
func (p *Provider) Protocol() string { return p.proto }

// TracerProvider is the provider to hand to instrumentation (otelgrpc).
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Tracer is the product's tracer.
func (p *Provider) Tracer() trace.Tracer { return p.tracer }

// Propagator is the W3C trace context propagator (traceparent, tracestate).
func (p *Provider) Propagator() propagation.TextMapPropagator { return p.prop }

// Shutdown flushes the spans ended so far and stops the exporter, within
// ctx. Call it last in the shutdown order; spans ended after it are
// dropped. Idempotent; a no-op when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

func protocolFrom(getenv func(string) string) (string, error) {
	name, v := envTracesProtocol, strings.TrimSpace(getenv(envTracesProtocol))
	if v == "" {
		name, v = envProtocol, strings.TrimSpace(getenv(envProtocol))
	}
	switch v {
	case "", "http/protobuf":
		return "http/protobuf", nil // the specification's default
	case "grpc":
		return "grpc", nil
	}
	return "", Problem{name, v, "http/protobuf or grpc"}
}

// SamplerFrom is the sampler of OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG, read here rather than by the SDK so that a bad
// value stops the binary at start instead of being logged and replaced.
// Unset: parentbased_always_on, the specification's default.
func SamplerFrom(getenv func(string) string) (sdktrace.Sampler, error) {
	s, _, err := samplerFrom(getenv)
	return s, err
}

// samplerFrom is SamplerFrom with the sampler's rule for a new trace.
func samplerFrom(getenv func(string) string) (sdktrace.Sampler, rootRule, error) {
	name := strings.ToLower(strings.TrimSpace(getenv(envSampler)))
	arg := strings.TrimSpace(getenv(envSamplerArg))
	ratio := func() (sdktrace.Sampler, rootRule, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), ratioRule(1), nil
		}
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, rootRule{}, Problem{envSamplerArg, arg, "a ratio in [0, 1]"}
		}
		return sdktrace.TraceIDRatioBased(f), ratioRule(f), nil
	}
	always, never := rootRule{kind: rootAlways}, rootRule{kind: rootNever}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), always, nil
	case "always_on":
		return sdktrace.AlwaysSample(), always, nil
	case "always_off":
		return sdktrace.NeverSample(), never, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), never, nil
	case "traceidratio":
		return ratio()
	case "parentbased_traceidratio":
		s, r, err := ratio()
		if err != nil {
			return nil, rootRule{}, err
		}
		return sdktrace.ParentBased(s), r, nil
	}
	return nil, rootRule{}, Problem{envSampler, name, "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"}
}

// newExporter builds the OTLP exporter of protocol; it reads its endpoint
// and the rest of its settings from the OTEL_EXPORTER_OTLP_* variables.
// Neither constructor connects: the first export does.
func newExporter(protocol string) (sdktrace.SpanExporter, error) {
	if protocol == "grpc" {
		return otlptracegrpc.New(context.Background())
	}
	return otlptracehttp.New(context.Background())
}

// lazyProcessor is the SDK's batch span processor, created with the first
// span that ends: the batch processor starts its goroutine when it is
// built, and a constructor must start nothing. Only sampled spans reach a
// processor, so the lock is taken at the sampling rate, not per decision.
type lazyProcessor struct {
	newExporter func() (sdktrace.SpanExporter, error)
	mu          sync.Mutex
	bsp         sdktrace.SpanProcessor // nil until the first span ends, or after a failed start
	closed      bool
	failed      bool
}

var _ sdktrace.SpanProcessor = (*lazyProcessor)(nil)

func (l *lazyProcessor) get() sdktrace.SpanProcessor {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bsp == nil && !l.closed && !l.failed {
		exp, err := l.newExporter()
		if err != nil {
			l.failed = true // reported once; spans are dropped
			otel.Handle(fmt.Errorf("tracing: OTLP exporter: %w", err))
			return nil
		}
		l.bsp = sdktrace.NewBatchSpanProcessor(exp)
	}
	return l.bsp
}

func (l *lazyProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (l *lazyProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if b := l.get(); b != nil {
		b.OnEnd(s)
	}
}

func (l *lazyProcessor) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	b := l.bsp
	l.mu.Unlock()
	if b == nil {
		return nil
	}
	return b.Shutdown(ctx)
}

func (l *lazyProcessor) ForceFlush(ctx context.Context) error {
	l.mu.Lock()
	b := l.bsp
	l.mu.Unlock()
	if b == nil {
		return nil
	}
	return b.ForceFlush(ctx)
}
