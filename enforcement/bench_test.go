package enforcement_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// BenchmarkLocalReject: a key whose bucket the local tier knows to be empty.
// This is the path a flood takes; it must cost less than an acceptance.
func BenchmarkLocalReject(b *testing.B) {
	l, r := flooded(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if d, _ := l.Check(ctx, r); d.Allowed || d.Source != enforcement.SourceLocal {
			b.Fatal("expected a local rejection")
		}
	}
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
	defer l.Close(context.Background())
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
	b.Cleanup(func() { l.Close(context.Background()) })
	r := req("flood", 1)
	for i := 0; i < 20; i++ {
		l.Check(context.Background(), r)
	}
	return l, r
}
