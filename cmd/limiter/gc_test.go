package main

import (
	"fmt"
	"testing"
	"time"
)

// The heap headroom (LIMITER_GC_HEADROOM_MIB) raises GOGC by default, is
// off at 0, and leaves an operator's GOGC alone: read from the process's
// own go_gc_gogc_percent while /check traffic makes it collect.
func TestGCHeadroomSetsThePacing(t *testing.T) {
	const pol = "version: 1\ndefault_tier: std\ntiers:\n  std: { rate: 1000000, burst: 1000000 }\n"
	for _, tc := range []struct {
		name string
		env  []string
		ok   func(float64) bool
		want string
	}{
		{"default", nil, func(p float64) bool { return p > 100 }, "above 100"},
		{"off", []string{"LIMITER_GC_HEADROOM_MIB=0"}, func(p float64) bool { return p == 100 }, "100"},
		{"operator's GOGC", []string{"GOGC=250"}, func(p float64) bool { return p == 250 }, "250"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startLimiter(t, pol, append([]string{"REDIS_ADDRS=", "KAFKA_BROKERS=", "LIMITER_GRPC_ADDR="}, tc.env...)...)
			// Traffic, so that the process collects at least once (the
			// pacing is set after a collection); then the value must hold.
			deadline := time.Now().Add(60 * time.Second)
			held := 0
			for i := 0; held < 3; i++ {
				for j := range 200 {
					p.check(t, fmt.Sprintf("k%d", j), "api", 1)
				}
				got := p.metric(t, "go_gc_gogc_percent ")
				if tc.ok(got) {
					held++
				} else {
					held = 0
				}
				if time.Now().After(deadline) {
					t.Fatalf("go_gc_gogc_percent %v after 60 s of /check traffic, want %s", got, tc.want)
				}
			}
		})
	}
}
