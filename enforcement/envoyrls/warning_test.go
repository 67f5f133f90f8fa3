package envoyrls_test

import (
	"testing"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
)

// The soft-limit warning reaches an Envoy caller as it reaches an HTTP one:
// ratelimit-warning: soft-limit, once consumption reaches the soft limit.
func TestSoftLimitWarningHeader(t *testing.T) {
	const y = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 4, soft_limit_percent: 60 }
domains:
  d:
    descriptors:
      - { match: [k], key: "{k}", scope: "s" }
`
	svc := envoyrls.New(envoyrlstest.Limiter(t, y), counter{})
	for i, want := range []string{"", "", "soft-limit"} { // 25%, 50%, 75% used of a 60% soft limit
		resp := call(t, svc, d("k", "x"))
		got := ""
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key == "ratelimit-warning" {
				got = h.Value
			}
		}
		if got != want {
			t.Fatalf("call %d: ratelimit-warning %q, want %q (%v)", i, got, want, resp.ResponseHeadersToAdd)
		}
	}
}
