package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSIGHUPReloadsTheProcess: the limiter binary re-reads its policy on a
// real SIGHUP, reports the new version and hash in /readyz and the metrics,
// and refuses a broken file with a log line while the old policy serves.
//
// POLICY_FILE is a symlink into another directory whose target is rewritten
// in place: the directory watch cannot see that, so only the signal can
// cause the reload (the log line names the trigger as well).
func TestSIGHUPReloadsTheProcess(t *testing.T) {
	real := filepath.Join(t.TempDir(), "v.yaml")
	if err := os.WriteFile(real, []byte(generation(0)), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	p := startLimiter(t, generation(0), "POLICY_FILE="+link)
	hashNow := func() string {
		pol, _ := p.readyz(t)["policy"].(map[string]any)
		h, _ := pol["hash"].(string)
		return h
	}
	if got, want := hashNow(), mustLoad(t, link).Hash(); got != want {
		t.Fatalf("/readyz policy hash %q, want %q", got, want)
	}
	if d, code := p.check(t, "k", "api:x", 1); code != 200 || d.Policy != "even" || d.Limit != 1000 {
		t.Fatalf("before: %d %+v", code, d)
	}

	if err := os.WriteFile(real, []byte(generation(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	want := mustLoad(t, link).Hash()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the SIGHUP reload in /readyz", func() bool { return hashNow() == want })
	// The new policy is in force a moment before the reload is counted and
	// logged: wait for those too rather than racing them.
	eventually(t, "the reload log line naming SIGHUP", func() bool {
		return strings.Contains(p.logs.String(), `"trigger":"SIGHUP"`)
	})
	eventually(t, "the reload counted", func() bool {
		return p.metric(t, `limiter_policy_reloads_total{result="ok"}`) >= 1
	})
	if n := p.metric(t, `limiter_policy_reloads_total{result="ok"}`); n != 1 {
		t.Errorf("reloads ok = %v, want 1", n)
	}
	if n := p.metric(t, `limiter_policy_info{hash="`+want+`",version="1"}`); n != 1 {
		t.Errorf("limiter_policy_info for the new hash = %v", n)
	}
	if d, code := p.check(t, "k2", "api:x", 1); code != 200 || d.Policy != "odd" || d.Limit != 2000 {
		t.Fatalf("after: %d %+v", code, d)
	}

	if err := os.WriteFile(real, []byte(brokenPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the refusal", func() bool {
		return p.metric(t, `limiter_policy_reloads_total{result="refused"}`) == 1
	})
	if g := p.metric(t, "limiter_policy_last_reload_successful"); g != 0 {
		t.Errorf("limiter_policy_last_reload_successful = %v after a refusal", g)
	}
	if hashNow() != want {
		t.Fatal("/readyz changed on a refused file")
	}
	if !strings.Contains(p.logs.String(), "tiers.free.rate (line 4): must be \\u003e 0") &&
		!strings.Contains(p.logs.String(), "tiers.free.rate (line 4): must be > 0") {
		t.Fatalf("the refusal's log line lacks the reason:\n%s", p.logs.String())
	}
	if d, code := p.check(t, "k3", "api:x", 1); code != 200 || d.Policy != "odd" {
		t.Fatalf("after the refusal: %d %+v", code, d)
	}
}
