package envoyrls_test

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
)

// TestConcurrencyOnlyIsRefusedAtTheEnvoyDoor: without SetSlots the Envoy
// door takes no slots, so a descriptor whose limit is a concurrency alone
// is answered FailedPrecondition (never OK: that would leave the limit
// unenforced), a release Unimplemented, and a limit with a rate and a
// concurrency is decided on its rate.
func TestConcurrencyOnlyIsRefusedAtTheEnvoyDoor(t *testing.T) {
	lim := envoyrlstest.Limiter(t, `
version: 1
default_tier: slots
tiers:
  slots: { concurrency: 2 }
  both:  { rate: 1, period: hour, burst: 1, concurrency: 2 }
keys: { b: both }
domains:
  d:
    descriptors:
      - { match: [k], key: "{k}", scope: "s" }
`)
	svc := envoyrls.New(lim, nil)
	_, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("k", "a")}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("concurrency alone: %v", err)
	}
	_, err = svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{d(envoyrls.ReleaseEntryKey, "x")}})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("a release: %v", err)
	}
	if resp := call(t, svc, d("k", "b")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("rate and concurrency, first: %v", resp.OverallCode)
	}
	if resp := call(t, svc, d("k", "b")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("rate and concurrency, past the burst: %v", resp.OverallCode)
	}
}
