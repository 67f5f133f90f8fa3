// Package envoyrlstest is what the Envoy rate limit service's tests and
// benchmarks in more than one package share: the benchmarks' policy and a
// Limiter over the in-process authority, so that the store does not
// dominate what they measure.
package envoyrlstest

import (
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
)

// BenchPolicy maps the descriptor [{key, <key>}] of domain "bench" to key
// <key>, scope "api", under a limit never reached (the allowed path).
const BenchPolicy = `
version: 1
default_tier: bulk
tiers:
  bulk:  { rate: 1000000, burst: 1000000 }
domains:
  bench:
    descriptors:
      - { match: [key], key: "{key}", scope: "api" }
`

// Limiter is a Limiter with the policy src over the in-process authority,
// closed when tb ends.
func Limiter(tb testing.TB, src string) *enforcement.Limiter {
	tb.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		tb.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1<<20), Policy: p})
	if err != nil {
		tb.Fatal(err)
	}
	return lim
}
