package policy

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Current re-reads a changed file, and keeps the previous policy (saying
// so once) when the new file is refused.
func TestCurrentReloadsAndKeepsThePreviousOnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(body string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Now()
	write("version: 1\ndefault_tier: a\ntiers:\n  a: { rate: 1, burst: 1 }\n", base)
	var refused []error
	c := NewCurrent(path, func(err error) { refused = append(refused, err) })
	p1, err := c.Get()
	if err != nil || p1.HasQuotas() {
		t.Fatalf("first load: %v", err)
	}
	if p, _ := c.Get(); p != p1 {
		t.Error("an unchanged file was parsed again")
	}
	write("version: 1\ndefault_tier: a\ntiers:\n  a: { rate: 1, burst: 1, quota: { limit: 5, period: day } }\n", base.Add(time.Second))
	p2, err := c.Get()
	if err != nil || p2 == p1 || !p2.HasQuotas() {
		t.Fatalf("after a change: %v, quotas %v", err, p2.HasQuotas())
	}
	write("version: 1\ndefault_tier: nope\n", base.Add(2*time.Second))
	for i := 0; i < 2; i++ {
		if p, err := c.Get(); err != nil || p != p2 {
			t.Fatalf("a refused file replaced the policy: %v", err)
		}
	}
	if len(refused) != 1 {
		t.Errorf("refusals reported %d times, want once", len(refused))
	}
	if _, err := NewCurrent(filepath.Join(t.TempDir(), "missing.yaml"), nil).Get(); err == nil {
		t.Error("a missing file with no previous policy is not an error")
	}
}
