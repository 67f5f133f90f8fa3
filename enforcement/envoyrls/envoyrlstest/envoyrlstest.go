// Package envoyrlstest is what the Envoy rate limit service's tests and
// benchmarks in more than one package share: a policy with the descriptor
// setups of docs/envoy.md, the benchmarks' policy and a Limiter over the
// in-process authority, so that the store does not dominate what they
// measure.
package envoyrlstest

import (
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
)

// EdgePolicy is domain "edge" with the three descriptor setups of
// docs/envoy.md (per client address, per API key and route, a global
// per-route limit), under rates of its own: per minute or slower, so that
// nothing refills noticeably during a test, however slow the machine.
const EdgePolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 10, period: minute, burst: 3 }
  pro:  { rate: 60, period: minute, burst: 6, quota: { limit: 100, period: day } }
rules:
  - name: anonymous
    key_prefix: "ip:"
    rate: 10
    period: minute
    burst: 3
  - name: search-global
    key: "global"
    scope: "route:/search"
    rate: 2
    period: hour
    burst: 2
  - name: export-trial
    scope: "route:/export"
    rate: 1
    period: day
    burst: 1
    dry_run: true
costs: { "route:/big": 5 }
keys: { k_pro: pro }
domains:
  edge:
    descriptors:
      - name: per-ip
        match: [remote_address]
        key: "ip:{remote_address}"
        scope: "edge"
      - name: per-key-route
        match: [api_key, path]
        key: "{api_key}"
        scope: "route:{path}"
      - name: global-route
        match: ["generic_key=global", path]
        key: "global"
        scope: "route:{path}"
`

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
