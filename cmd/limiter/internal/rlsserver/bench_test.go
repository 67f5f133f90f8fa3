package rlsserver

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkGRPCShouldRateLimit is the whole gRPC front door (the server
// New builds, its interceptors, the codec, the service) over loopback
// TCP, with the in-process authority so that the store does not dominate:
// what the transport costs per decision. The client runs in the same
// process: profile with -cpuprofile and read the server's frames.
func BenchmarkGRPCShouldRateLimit(b *testing.B) {
	lim := envoyrlstest.Limiter(b, envoyrlstest.BenchPolicy)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
	// The server's goroutines (started by Serve, inheriting its labels)
	// carry side=server in a CPU profile: `go tool pprof -tagfocus
	// side=server` shows the server's share without the client's, which
	// runs in the same process.
	stop := serveGRPC(b, Config{Addr: addr}, lim, pprof.Labels("side", "server"))
	defer stop()
	client := rlsv3.NewRateLimitServiceClient(dial(b, addr))
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "acct_"+strconv.Itoa(i))}}
	}
	var next atomic.Uint64
	b.SetParallelism(16) // 32 callers on 2 cores, as the load tools run
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := proccpu.Self()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := client.ShouldRateLimit(ctx, reqs[next.Add(1)%uint64(len(reqs))])
			cancel()
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Errorf("ShouldRateLimit: %v %v", resp, err)
				return
			}
		}
	})
	// Wall time per call measures the machine's other work as much as this
	// code on a shared 2-core box; the process's CPU time per call does not.
	b.ReportMetric(float64(proccpu.Self()-cpu0)/float64(b.N), "cpu-ns/op")
}
