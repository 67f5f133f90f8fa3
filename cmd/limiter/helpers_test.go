package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// generation returns a valid policy that differs from its neighbours in
// content (hash) and in the limit it sets: even generations give scope
// api:* a burst of 1000 under rule "even", odd ones 2000 under "odd".
func generation(n int) string {
	name, burst := "even", 1000
	if n%2 == 1 {
		name, burst = "odd", 2000
	}
	return fmt.Sprintf(`# generation %d
version: 1
default_tier: free
tiers:
  free: { rate: 1000, burst: 1000 }
rules:
  - name: %s
    scope: "api:*"
    rate: %d
    burst: %d
`, n, name, burst, burst)
}

const brokenPolicy = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 0, burst: 5 }\n"

// eventually polls cond. The deadline only bounds a hung test; no
// assertion here is about speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(20 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustLoad(t testing.TB, path string) *policy.Policy {
	t.Helper()
	p, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
