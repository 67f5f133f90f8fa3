package envoyrls_test

import (
	"context"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
)

// TestKeyText: the rule of /check (httpapi.TextProblem) for the key and
// scope a descriptor maps to: a control character or bytes that are not
// UTF-8 are INVALID_ARGUMENT naming the mapping, and nothing is spent, not
// even by the descriptors before it.
func TestKeyText(t *testing.T) {
	lim := envoyrlstest.Limiter(t, unitPolicy)
	svc := envoyrls.New(lim, nil)
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"k", "a\x00b"}, "makes a key that has a control character (U+0000) at byte 1"},
		{[]string{"k", "a\nb"}, "makes a key that has a control character (U+000A)"},
		{[]string{"k", "a\xff"}, "makes a key that is not valid UTF-8 (byte 1)"},
		{[]string{"k", "a", "s", "x\x1b[2J"}, "makes a scope that has a control character (U+001B)"},
	} {
		_, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("k", "first"), d(c.kv...)}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want InvalidArgument with %q", c.kv, err, c.want)
		}
	}
	dd, err := lim.Check(context.Background(), enforcement.Request{Key: "first", Scope: "s", Cost: 0, HasCost: true})
	if err != nil || dd.Remaining != 2 {
		t.Errorf("the descriptor before a refused one spent: %d left, want 2 (%v)", dd.Remaining, err)
	}
	if resp := call(t, svc, d("k", "usér:é日本")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a Unicode key: %v", resp)
	}
}
