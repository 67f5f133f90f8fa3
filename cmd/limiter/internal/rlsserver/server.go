// Package rlsserver is the limiter's gRPC server: the Envoy rate limit
// service (enforcement/envoyrls), the gRPC health service and reflection
// on LIMITER_GRPC_ADDR, with the bearer token checked on every call but
// health's, and per-method and per-descriptor metrics.
package rlsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/internal/vtcodec"

	"github.com/ratewarden/ratewarden/limits"

	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/tlsconf"
)

// DefaultAddr is LIMITER_GRPC_ADDR's default (docs/reference.md).
const DefaultAddr = "127.0.0.1:8083"

// grpcMaxMessage bounds a gRPC request, as /check bounds its body.
const grpcMaxMessage = limits.MaxRequestBytes

// grpcStreamWorkers is the number of goroutines that serve calls. A call
// that finds every worker busy gets a goroutine of its own, whose stack
// then grows through grpc-go, the service, the guard and go-redis on every
// call (with GOMAXPROCS workers nearly every call overflowed, because a
// worker waits for Redis, and stack copying became a large share of the
// server's CPU). Workers keep their grown stacks, so there
// must be about as many as calls in flight (a decision waits for a Redis
// round trip): 128 covers Envoy's usual few connections with dozens of
// concurrent streams for a few MB of stacks; beyond it calls still run,
// as before, on goroutines of their own.
const grpcStreamWorkers = 128

// lookupEnv tells a variable set to empty from an unset one, which a
// getenv cannot.
var lookupEnv = os.LookupEnv

// AddrFromEnv reads LIMITER_GRPC_ADDR: unset = the default, set and
// empty = the gRPC server is off. isDefault reports the default.
func AddrFromEnv(e *envconfig.Reader) (addr string, isDefault bool) {
	const name = "LIMITER_GRPC_ADDR"
	if v := strings.TrimSpace(e.Raw(name)); v != "" {
		e.HostPort(name, v)
		return v, false
	}
	if _, set := lookupEnv(name); set {
		return "", false
	}
	return DefaultAddr, true
}

// grpcMetrics are the gRPC server's metrics: per method, and per
// descriptor of the rate limit service.
type grpcMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec
	byResult *prometheus.CounterVec
	results  []prometheus.Counter
	methods  sync.Map // full method → *methodMetrics
}

func newGRPCMetrics(reg prometheus.Registerer) *grpcMetrics {
	m := &grpcMetrics{
		requests: promdecl.CounterVec("limiter_grpc_requests_total", "gRPC calls by full method and status code.", "method", "code"),
		latency:  promdecl.HistogramVec("limiter_grpc_request_duration_seconds", "gRPC call latency by full method, from the call's arrival to its answer (unary) or end (stream).", []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1}, "method"),
		inFlight: promdecl.GaugeVec("limiter_grpc_in_flight", "gRPC calls being served, by full method.", "method"),
		byResult: promdecl.CounterVec("limiter_envoy_descriptors_total", "Descriptors of ShouldRateLimit calls by result: ok, over_limit, would_reject (dry run), no_match and unknown_domain (answered OK with no limit), not_evaluated (after a rejected descriptor: nothing spent), cost_exceeds_limit.", "result"),
	}
	reg.MustRegister(m.requests, m.latency, m.inFlight, m.byResult)
	for _, r := range envoyrls.Results() {
		m.results = append(m.results, m.byResult.WithLabelValues(r.String()))
	}
	return m
}

// Descriptor implements envoyrls.Observer.
func (m *grpcMetrics) Descriptor(_ string, r envoyrls.Result) {
	if int(r) < len(m.results) {
		m.results[r].Inc()
	}
}

// methodMetrics are one method's series, looked up once: label hashing
// on every call would cost more than the rest of the bookkeeping.
type methodMetrics struct {
	inFlight prometheus.Gauge
	latency  prometheus.Observer
	codes    [17]atomic.Pointer[prometheus.Counter] // by codes.Code; created on first use
}

func (m *grpcMetrics) method(name string) *methodMetrics {
	if v, ok := m.methods.Load(name); ok {
		return v.(*methodMetrics)
	}
	mm := &methodMetrics{inFlight: m.inFlight.WithLabelValues(name), latency: m.latency.WithLabelValues(name)}
	v, _ := m.methods.LoadOrStore(name, mm)
	return v.(*methodMetrics)
}

func (m *grpcMetrics) observe(method string, mm *methodMetrics, start time.Time, err error) {
	code := status.Code(err)
	switch {
	case int(code) >= len(mm.codes):
		m.requests.WithLabelValues(method, code.String()).Inc()
	case mm.codes[code].Load() != nil:
		(*mm.codes[code].Load()).Inc()
	default:
		// Only here does a counter escape to the heap: declared above the
		// switch, it would cost an allocation on every call.
		c := m.requests.WithLabelValues(method, code.String())
		mm.codes[code].Store(&c)
		c.Inc()
	}
	mm.latency.Observe(time.Since(start).Seconds())
}

// grpcAuth checks the bearer token (metadata "authorization: Bearer
// <token>") on every call but the health service's, as /check requires it
// and /healthz does not.
type grpcAuth struct {
	open  bool // no token configured
	token bearer.Checker
}

func (a grpcAuth) check(ctx context.Context, method string) error {
	if a.open || strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return nil
	}
	// ValueFromIncomingContext copies one key's values, where
	// FromIncomingContext would copy every header of the call.
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if a.token.Allows(v) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "a valid bearer token is required (metadata authorization: Bearer <token>)")
}

// Config is the gRPC server's part of the limiter's configuration.
type Config struct {
	Addr          string // LIMITER_GRPC_ADDR; empty = off
	AddrIsDefault bool   // LIMITER_GRPC_ADDR unset: a taken port is a warning, not a failure
	AuthToken     string // LIMITER_AUTH_TOKEN; empty = no token required
	// TLS is the listener certificate (LIMITER_TLS_CERT_FILE,
	// LIMITER_TLS_KEY_FILE); nil = plain text.
	TLS *tlsconf.ServerCert
	// EnvoyHeaders is LIMITER_ENVOY_HEADERS: the answers' response_headers_to_add.
	EnvoyHeaders ratelimitheader.Mode
	// Slots takes and gives back concurrency slots (envoyrls.Service.SetSlots);
	// nil = the door takes none.
	Slots envoyrls.Slots
}

// Server is the Envoy rate limit service, the gRPC health service and
// reflection, listening on LIMITER_GRPC_ADDR: Serve serves until Shutdown.
type Server struct {
	srv *grpc.Server
	hs  *health.Server
	ln  net.Listener
}

// New listens on cfg.Addr and builds the server; nil when the service is
// off. extra are more server options (the tracing stats handler).
func New(cfg Config, lim envoyrls.Limiter, reg prometheus.Registerer, log *slog.Logger, extra ...grpc.ServerOption) (*Server, error) {
	if cfg.Addr == "" {
		log.Info("LIMITER_GRPC_ADDR is empty: the Envoy rate limit service (gRPC) is off")
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		if cfg.AddrIsDefault {
			// Not asked for by name: the limiter still serves /check.
			log.Warn("the Envoy rate limit service (gRPC) is off: LIMITER_GRPC_ADDR is unset and its default address is taken; set LIMITER_GRPC_ADDR",
				"addr", cfg.Addr, "err", err)
			return nil, nil
		}
		return nil, fmt.Errorf("listen on LIMITER_GRPC_ADDR %s: %w", cfg.Addr, err)
	}
	m := newGRPCMetrics(reg)
	auth := grpcAuth{open: cfg.AuthToken == "", token: bearer.NewChecker(cfg.AuthToken)}
	opts := []grpc.ServerOption{
		grpc.Creds(creds(cfg.TLS)), // plain text unless LIMITER_TLS_CERT_FILE (tls.go)
		grpc.MaxRecvMsgSize(grpcMaxMessage),
		grpc.NumStreamWorkers(grpcStreamWorkers),
		grpc.SharedWriteBuffer(true),
	}
	// Generated marshalers for the answers when built with the vtprotobuf
	// tag (the Makefile's and the Dockerfile's builds); none otherwise.
	opts = append(opts, vtcodec.ServerOptions()...)
	opts = append(opts, extra...)
	srv := grpc.NewServer(append(opts,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			start := time.Now()
			mm := m.method(info.FullMethod)
			mm.inFlight.Inc()
			defer mm.inFlight.Dec()
			resp, err := func() (any, error) {
				if err := auth.check(ctx, info.FullMethod); err != nil {
					return nil, err
				}
				return handler(ctx, req)
			}()
			m.observe(info.FullMethod, mm, start, err)
			return resp, err
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			start := time.Now()
			mm := m.method(info.FullMethod)
			mm.inFlight.Inc()
			defer mm.inFlight.Dec()
			err := auth.check(ss.Context(), info.FullMethod)
			if err == nil {
				err = handler(srv, ss)
			}
			m.observe(info.FullMethod, mm, start, err)
			return err
		}),
	)...)
	rls := envoyrls.New(lim, m)
	rls.SetHeaderMode(cfg.EnvoyHeaders)
	if cfg.Slots != nil {
		rls.SetSlots(cfg.Slots)
	}
	rlsv3.RegisterRateLimitServiceServer(srv, rls)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)

	log.Info("envoy rate limit service listening", "addr", ln.Addr().String(), "service", rlsv3.RateLimitService_ServiceDesc.ServiceName,
		"tls", cfg.TLS != nil, "generated_marshalers", vtcodec.Enabled)
	return &Server{srv: srv, hs: hs, ln: ln}, nil
}

// Serve serves until Shutdown; it returns nil once stopped.
func (g *Server) Serve() error {
	if err := g.srv.Serve(g.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpc serve: %w", err)
	}
	return nil
}

// Shutdown stops the server gracefully: health turns NOT_SERVING, new
// calls are refused, calls in flight finish until ctx ends; then they are
// cut, and that is the error. The listener is closed too when Serve never
// ran (a start that failed after New).
func (g *Server) Shutdown(ctx context.Context) error {
	g.hs.Shutdown() // NOT_SERVING: health checkers stop sending first
	stopped := make(chan struct{})
	go func() { g.srv.GracefulStop(); _ = g.ln.Close(); close(stopped) }()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		g.srv.Stop() // the grace period is over: cut what is left
		<-stopped
		return errors.New("grpc: calls still in flight at the end of the shutdown grace were cut")
	}
}
