package rlsserver

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestAddrFromEnv(t *testing.T) {
	defer func() { lookupEnv = os.LookupEnv }()
	for _, c := range []struct {
		env       map[string]string
		addr      string
		isDefault bool
	}{
		{map[string]string{}, DefaultAddr, true},
		{map[string]string{"LIMITER_GRPC_ADDR": ""}, "", false},
		{map[string]string{"LIMITER_GRPC_ADDR": "0.0.0.0:9000"}, "0.0.0.0:9000", false},
	} {
		lookupEnv = func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }
		e := envconfig.New(func(k string) string { return c.env[k] })
		addr, isDefault := AddrFromEnv(e)
		if addr != c.addr || isDefault != c.isDefault || e.Err() != nil {
			t.Errorf("%v: %q %v %v; want %q %v", c.env, addr, isDefault, e.Err(), c.addr, c.isDefault)
		}
	}
}

func TestOffWithoutAnAddress(t *testing.T) {
	s, err := New(Config{}, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if s != nil || err != nil {
		t.Fatalf("New without an address: %v, %v; want nil, nil (off)", s, err)
	}
}

// With a token every call but the health service's needs it.
func TestAuth(t *testing.T) {
	lim := envoyrlstest.Limiter(t, envoyrlstest.BenchPolicy)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	t.Cleanup(serveGRPC(t, Config{Addr: addr, AuthToken: "s3cret"}, lim, pprof.Labels()))
	conn := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "k")}}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("without the token: %v, want Unauthenticated", err)
	}
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(authed, req); err != nil {
		t.Errorf("with the token: %v", err)
	}
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without the token: %v, %v; want SERVING", r, err)
	}
}
