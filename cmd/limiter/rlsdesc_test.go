package main

import (
	"fmt"
	"runtime/pprof"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/internal/testenv"
)

// registerRLS serves what go-control-plane's generated registration
// serves: a method added to the service by a newer go-control-plane
// must be added there too, or it would answer UNIMPLEMENTED.
func TestRegisterRLSServesTheGeneratedMethods(t *testing.T) {
	gen := rlsv3.RateLimitService_ServiceDesc
	if len(gen.Methods) != 1 || gen.Methods[0].MethodName != "ShouldRateLimit" || len(gen.Streams) != 0 {
		t.Fatalf("go-control-plane's RateLimitService now has methods %v and streams %v: registerRLS serves ShouldRateLimit only", gen.Methods, gen.Streams)
	}
}

// Decoded requests are recycled: a call must see its own descriptors
// only, whatever the call before it on the same server carried.
func TestRecycledRequestsDoNotLeak(t *testing.T) {
	lim := envoyrlstest.Limiter(t, envoyrlstest.BenchPolicy)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	t.Cleanup(serveGRPC(t, config{GRPCAddr: addr}, lim, pprof.Labels()))
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	for i := range 50 {
		n := 1 + i%3
		var ds []*ratelimitv3.RateLimitDescriptor
		for j := range n {
			ds = append(ds, desc("key", fmt.Sprintf("k%d_%d", i, j)))
		}
		resp := rls(t, client, "bench", 0, ds...)
		if len(resp.GetStatuses()) != n || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d with %d descriptors answered %d statuses (%v)", i, n, len(resp.GetStatuses()), resp.GetOverallCode())
		}
	}
	// An unknown domain after a known one answers for that domain alone.
	if resp := rls(t, client, "elsewhere", 0, desc("key", "k")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("unknown domain after known ones: %v", resp)
	}
}
