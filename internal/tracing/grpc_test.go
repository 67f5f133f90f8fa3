package tracing_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/testkit/otlptest"
)

// Over a real gRPC server and otelgrpc: calls without a traceparent that
// the ratio drops make no span, and a call carrying a sampled traceparent
// makes its server span in the caller's trace.
func TestGRPCServerSamplesBeforeOtelgrpc(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "1e-15") // a new trace: kept once in 10^15
	p, err := tracing.New(os.Getenv, "limiter")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.StatsHandler(p.GRPCServer(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(p.TracerProvider()), otelgrpc.WithPropagators(p.Propagator())))))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() { srv.Stop(); <-served }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 50 {
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	traced := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := client.Check(traced, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// The server ends a call's span after the client has its answer
	// (grpc-go reports stats.End once the status is written): stop the
	// server first, which waits for its handlers, and only then the
	// provider, as the limiter stops them. A provider shut down first
	// drops the span that ends after it.
	srv.GracefulStop()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Wait(t, "the traced call's span", 30*time.Second, func(s []otlptest.Span) bool { return len(s) > 0 })
	if len(spans) != 1 || spans[0].TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || spans[0].ParentSpanID != "00f067aa0ba902b7" {
		t.Fatalf("spans %+v: want the traced call's only", spans)
	}
}
