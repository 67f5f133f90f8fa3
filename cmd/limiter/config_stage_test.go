package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// runBounded runs the limiter binary with args and env (over a loopback
// LIMITER_ADDR and no gRPC), killed after 30 s so that a value it wrongly
// accepts fails the case instead of hanging the run.
func runBounded(t *testing.T, args []string, env ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, limiterBin, args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("LIMITER_ADDR=127.0.0.1:%d", testenv.FreePort(t)), "LIMITER_GRPC_ADDR=",
		"POLICY_FILE=../../deploy/policy.yaml")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("still running after 30 s: %s", out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// TestConfigErrorsExitTwoTogether: every configuration error, whichever
// stage used to find it (the variables, REDIS_STORES, the OTEL_* ones
// internal/tracing reads, which used to exit 1 after other setup), stops
// the limiter before anything starts: exit 2, one line naming each.
func TestConfigErrorsExitTwoTogether(t *testing.T) {
	testenv.SkipShort(t)
	t.Parallel()
	badPolicy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(badPolicy, []byte("version: 1\ndefault_tier: missing\ntiers:\n  std: { rate: -1, burst: 1 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		want []string
	}{
		{[]string{"LIMITER_STORE_TIMEOUT=soon"}, []string{"LIMITER_STORE_TIMEOUT"}},
		{[]string{"REDIS_STORES=acme"}, []string{"REDIS_STORES"}},
		{[]string{"OTEL_TRACES_SAMPLER=sometimes"}, []string{"OTEL_TRACES_SAMPLER"}},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=::nohost"}, []string{"OTEL_EXPORTER_OTLP_ENDPOINT"}},
		{[]string{"OTEL_EXPORTER_OTLP_TIMEOUT=10s"}, []string{"OTEL_EXPORTER_OTLP_TIMEOUT"}},
		{[]string{"OTEL_EXPORTER_OTLP_HEADERS=authorization"}, []string{"OTEL_EXPORTER_OTLP_HEADERS"}},
		{[]string{"LIMITER_METRICS_RAW_KEYS=true", "LIMITER_METRICS_KEY_SECRET=s"}, []string{"LIMITER_METRICS_RAW_KEYS"}},
		// The policy file, read first by run: the configuration's error too.
		{[]string{"POLICY_FILE=" + badPolicy}, []string{"POLICY_FILE"}},
		{[]string{"POLICY_FILE=" + badPolicy + ".missing"}, []string{"POLICY_FILE"}},
		{[]string{"LIMITER_SHADOW_POLICY_FILE=" + badPolicy}, []string{"LIMITER_SHADOW_POLICY_FILE"}},
		{[]string{"LIMITER_STORE_TIMEOUT=soon", "REDIS_STORES=acme", "OTEL_EXPORTER_OTLP_PROTOCOL=pigeon", "OTEL_SDK_DISABLED=maybe"},
			[]string{"LIMITER_STORE_TIMEOUT", "REDIS_STORES", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED"}},
	} {
		t.Run(strings.Join(tc.want, "+"), func(t *testing.T) {
			t.Parallel()
			code, out := runBounded(t, nil, tc.env...)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if code != 2 || len(lines) != 1 || !strings.Contains(lines[0], "invalid configuration") {
				t.Fatalf("exit %d, output %q: want 2 and one line", code, out)
			}
			for _, name := range tc.want {
				if !strings.Contains(lines[0], name+":") {
					t.Errorf("the line does not name %s: %s", name, lines[0])
				}
			}
		})
	}
}

// TestPolicyCommandsRefuseBadStores: policy check and explain refuse a
// REDIS_STORES the limiter would refuse (they used to ignore its errors):
// exit 2, one line naming it, before reading the policy.
func TestPolicyCommandsRefuseBadStores(t *testing.T) {
	testenv.SkipShort(t)
	t.Parallel()
	for _, args := range [][]string{
		{"policy", "check", "../../deploy/policy.yaml"},
		{"policy", "explain", "../../deploy/policy.yaml", "--key", "ip:203.0.113.9", "--scope", "api:read"},
	} {
		code, out := runBounded(t, args, "REDIS_STORES=acme=;default=127.0.0.1:6379")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 2 || len(lines) != 1 || strings.Count(lines[0], "REDIS_STORES:") != 2 {
			t.Errorf("%v: exit %d, output %q: want 2 and one line naming REDIS_STORES twice", args[:2], code, out)
		}
		if code, out := runBounded(t, args, "REDIS_STORES=acme=127.0.0.1:6379"); code != 0 {
			t.Errorf("%v with a good REDIS_STORES: exit %d %s", args[:2], code, out)
		}
	}
}

// TestBinaryStartFailureExitsOne: past the configuration, a start that
// fails (LIMITER_ADDR taken, after the gRPC listener opened) is exit 1
// with the error naming the variable.
func TestBinaryStartFailureExitsOne(t *testing.T) {
	testenv.SkipShort(t)
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	code, out := runBounded(t, nil, "LIMITER_ADDR="+taken.Addr().String(),
		fmt.Sprintf("LIMITER_GRPC_ADDR=127.0.0.1:%d", testenv.FreePort(t)))
	if code != 1 || !strings.Contains(out, "listen on LIMITER_ADDR") || strings.Contains(out, "invalid configuration") {
		t.Fatalf("exit %d, output %s: want 1 and the listen error", code, out)
	}
}

// TestFailedStartReleasesWhatItOpened: a start that fails after the gRPC
// listener and the Redis clients were opened (LIMITER_ADDR taken) closes
// them: the gRPC port can be listened on again and Redis holds no
// connection of the limiter's.
func TestFailedStartReleasesWhatItOpened(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := map[string]string{
		"LIMITER_ADDR": taken.Addr().String(), "LIMITER_GRPC_ADDR": grpcAddr, "REDIS_ADDRS": r.Addr(),
		"POLICY_FILE": "../../deploy/policy.yaml", "LIMITER_SHUTDOWN_GRACE": "2s",
	}
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "LIMITER_ADDR") {
		t.Fatalf("run: %v, want the listen error", err)
	}
	ln, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		t.Fatalf("the gRPC listener was left open: %v", err)
	}
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer rdb.Close()
	for {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(strings.TrimSpace(list), "\n") == 0 {
			break // only this check's connection
		}
		if ctx.Err() != nil {
			t.Fatalf("the limiter's Redis connections were left open:\n%s", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
