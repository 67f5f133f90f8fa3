package enforcement_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// BenchmarkLocalReject: a key whose bucket the local tier knows to be empty.
// This is the path a flood takes; it must cost less than an acceptance.
//
// Besides ns/op it reports cpu-ns/op, the benchmark thread's own CPU time
// per decision: on a machine shared with other work that is the steadier
// figure, since wall time also counts the time the thread waited for a CPU.
func BenchmarkLocalReject(b *testing.B) {
	l, r := flooded(b)
	ctx := context.Background()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := threadCPU(b)
	for i := 0; i < b.N; i++ {
		if d, _ := l.Check(ctx, r); d.Allowed || d.Source != enforcement.SourceLocal {
			b.Fatal("expected a local rejection")
		}
	}
	b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// threadCPU is the calling thread's time on a CPU in ns
// (/proc/thread-self/schedstat, the scheduler's own exact account).
func threadCPU(b *testing.B) int64 {
	raw, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		b.Skipf("no per-thread CPU time here: %v", err)
	}
	ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
	if err != nil {
		b.Fatalf("reading /proc/thread-self/schedstat %q: %v", raw, err)
	}
	return ns
}

// BenchmarkLocalRejectParallel: the same flood from every core at once.
func BenchmarkLocalRejectParallel(b *testing.B) {
	l, r := flooded(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Check(ctx, r)
		}
	})
}

// BenchmarkAcceptSingleNode: an allowed decision through the local tier and
// the in-process authority (single-node mode), over 10,000 keys.
func BenchmarkAcceptSingleNode(b *testing.B) {
	l, _ := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 100000), Policy: policyOf(1e9, 1e9)})
	ctx := context.Background()
	reqs := make([]enforcement.Request, 10000)
	for i := range reqs {
		reqs[i] = req("acct_"+strconv.Itoa(i), 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if d, _ := l.Check(ctx, reqs[i%len(reqs)]); !d.Allowed {
			b.Fatal("rejected")
		}
	}
}

func BenchmarkBucketTake(b *testing.B) {
	var bk enforcement.Bucket
	now := time.Now().UnixMicro()
	for i := 0; i < b.N; i++ {
		bk.Take(now+int64(i), 1e6, 1e6, 1)
	}
}

// flooded is a limiter whose one key has spent its burst, and that key's request.
func flooded(b *testing.B) (*enforcement.Limiter, enforcement.Request) {
	l, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1000), Policy: policyOf(0.001, 10)})
	if err != nil {
		b.Fatal(err)
	}
	r := req("flood", 1)
	for i := 0; i < 20; i++ {
		l.Check(context.Background(), r)
	}
	return l, r
}
