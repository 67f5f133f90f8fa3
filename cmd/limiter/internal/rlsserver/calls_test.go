package rlsserver

import (
	"fmt"
	"runtime/pprof"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// A call sees its own descriptors only, whatever the call before it on
// the same server carried.
func TestEachCallSeesItsOwnDescriptors(t *testing.T) {
	lim := envoyrlstest.Limiter(t, envoyrlstest.BenchPolicy)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	t.Cleanup(serveGRPC(t, Config{Addr: addr}, lim, pprof.Labels()))
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
