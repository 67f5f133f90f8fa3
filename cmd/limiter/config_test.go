package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestConfigDefaults(t *testing.T) {
	c, err := loadConfig(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.PolicyFile != "deploy/policy.yaml" || c.KafkaTopic != "ratelimit.decisions" ||
		c.ExpectedInstances != 1 || len(c.Redis.Addrs) != 0 || len(c.KafkaBrokers) != 0 || c.StoreInFlight != 0 {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestConfigReportsEveryBadVariable(t *testing.T) {
	env := map[string]string{
		"LIMITER_EXPECTED_INSTANCES":      "zero",
		"LIMITER_STORE_TIMEOUT":           "-5ms",
		"LIMITER_STORE_BATCHES_IN_FLIGHT": "65",
		"LIMITER_DEGRADED_MAX_RATE":       "10",
		"REDIS_ADDRS":                     "10.0.0.1:6379, 10.0.0.2:6379",
	}
	c, err := loadConfig(func(k string) string { return env[k] })
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, name := range []string{"LIMITER_EXPECTED_INSTANCES", "LIMITER_STORE_TIMEOUT", "LIMITER_STORE_BATCHES_IN_FLIGHT", "LIMITER_DEGRADED_MAX_RATE"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	if len(c.Redis.Addrs) != 2 || c.Redis.Addrs[1] != "10.0.0.2:6379" {
		t.Errorf("REDIS_ADDRS parsed as %q", c.Redis.Addrs)
	}
}

func TestInvalidConfigExitsWithOneLine(t *testing.T) {
	testenv.SkipShort(t) // runs the binary
	cmd := exec.Command(limiterBin)
	cmd.Env = append(os.Environ(), "LIMITER_EXPECTED_INSTANCES=-1")
	out, err := cmd.CombinedOutput()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 {
		t.Fatalf("exit: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "LIMITER_EXPECTED_INSTANCES") {
		t.Fatalf("output %q: want one line naming the variable", out)
	}
}

func TestPolicyCommands(t *testing.T) {
	var out, errOut strings.Builder
	if code := policyCommand([]string{"check", "../../deploy/policy.yaml"}, &out, &errOut); code != 0 {
		t.Fatalf("check of the demo policy: %d %s", code, errOut.String())
	}
	out.Reset()
	if code := policyCommand([]string{"explain", "../../deploy/policy.yaml", "--key", "ip:203.0.113.9", "--scope", "api:read"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "winner: anonymous") {
		t.Fatalf("explain: %d %s", code, out.String())
	}
}

func TestLocalMaxBytes(t *testing.T) {
	c, err := loadConfig(func(k string) string { return map[string]string{"LIMITER_LOCAL_MAX_BYTES": "33554432"}[k] })
	if err != nil || c.LocalMaxBytes != 32<<20 {
		t.Fatalf("LIMITER_LOCAL_MAX_BYTES=33554432: %d, %v", c.LocalMaxBytes, err)
	}
	if _, err := loadConfig(func(k string) string { return map[string]string{"LIMITER_LOCAL_MAX_BYTES": "1000"}[k] }); err == nil ||
		!strings.Contains(err.Error(), "LIMITER_LOCAL_MAX_BYTES") {
		t.Fatalf("a bound below 1 MiB: %v", err)
	}
	for _, c := range []struct{ set, container, want int64 }{
		{0, 0, 64 << 20},                // the default
		{0, 512 << 20, 64 << 20},        // a pod of 512 MiB: the default fits
		{0, 128 << 20, 32 << 20},        // a small pod: a quarter of it
		{0, 2 << 20, 1 << 20},           // never below 1 MiB
		{16 << 20, 128 << 20, 16 << 20}, // the operator's figure wins
		{256 << 20, 128 << 20, 256 << 20},
	} {
		if got := localMaxBytes(c.set, c.container); got != c.want {
			t.Errorf("localMaxBytes(%d, %d) = %d, want %d", c.set, c.container, got, c.want)
		}
	}
}
