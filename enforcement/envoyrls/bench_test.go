package envoyrls_test

import (
	"context"
	"strconv"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
)

// BenchmarkShouldRateLimit is the service's own cost over Limiter.Check
// (in-process authority, no transport): compare with BenchmarkCheck.
func BenchmarkShouldRateLimit(b *testing.B) {
	lim := envoyrlstest.Limiter(b, envoyrlstest.BenchPolicy)
	svc := envoyrls.New(lim, nil)
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: "acct_" + strconv.Itoa(i)}}}}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	lim := envoyrlstest.Limiter(b, envoyrlstest.BenchPolicy)
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "acct_" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := lim.Check(context.Background(), enforcement.Request{Key: keys[i%len(keys)], Scope: "api"}); err != nil {
			b.Fatal(err)
		}
	}
}
