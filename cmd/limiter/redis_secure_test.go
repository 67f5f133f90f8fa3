package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// redisPW is the ACL user's password in these tests: random-looking, so
// that finding it in a log, /readyz or /metrics cannot be a coincidence.
const redisPW = "rw-Redis-pw-9d41c7e0b2a8f653"

// secureRedisEnv is the limiter's environment for a TLS-only Redis with
// an ACL user; the password is given as a file (a Kubernetes secret).
func secureRedisEnv(t *testing.T, certs *testenv.Certs, pwFile string, addrs ...string) []string {
	return []string{
		"REDIS_ADDRS=" + strings.Join(addrs, ","),
		"REDIS_USERNAME=ratewarden",
		"REDIS_PASSWORD_FILE=" + pwFile,
		"REDIS_TLS=true",
		"REDIS_TLS_CA_FILE=" + certs.CAFile,
		"REDIS_TLS_CERT_FILE=" + certs.ClientCert,
		"REDIS_TLS_KEY_FILE=" + certs.ClientKey,
		"LIMITER_BREAKER_OPEN_FOR=200ms",
		"LIMITER_FLEET_HEARTBEAT=100ms",
	}
}

func writeSecret(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// assertNoSecret fails when any secret appears in the limiter's logs,
// /readyz or /metrics.
func assertNoSecret(t *testing.T, p *limiterProc, secrets ...string) {
	t.Helper()
	resp, err := client.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp, err = client.Get(p.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, s := range secrets {
		for what, text := range map[string]string{"the logs": p.logs.String(), "/readyz": string(ready), "/metrics": string(metrics)} {
			if strings.Contains(text, s) {
				t.Errorf("%s contain a secret (%d bytes)", what, len(s))
			}
		}
	}
}

// TestSecureRedisTLSAndACL: against a TLS-only Redis (client certificates
// required) with an ACL user limited to the limiter's keys, standalone and
// Cluster, decisions are shared; the password, given as a file, appears
// nowhere.
func TestSecureRedisTLSAndACL(t *testing.T) {
	t.Parallel()
	certs := testenv.NewCerts(t)
	sec := testenv.Secure{Certs: certs, User: "ratewarden", Password: redisPW, KeyPattern: "rl:*", ClientCerts: true}
	pwFile := filepath.Join(t.TempDir(), "redis-password")
	writeSecret(t, pwFile, redisPW)
	for _, tc := range []struct {
		name, store string
		addrs       func(t *testing.T) []string
	}{
		{"standalone", "redis", func(t *testing.T) []string { return []string{testenv.StartSecureRedis(t, sec).Addr()} }},
		{"cluster", "redis-cluster", func(t *testing.T) []string { return testenv.StartSecureCluster(t, 3, sec).Addrs() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startLimiter(t, faultPolicy, secureRedisEnv(t, certs, pwFile, tc.addrs(t)...)...)
			waitFor(t, "a shared decision over TLS as the ACL user", 30*time.Second, func() bool {
				d, _ := p.check(t, "acct", "api", 1)
				return d.Source == "shared"
			})
			for i := range 20 {
				if d, code := p.check(t, "acct", "api", 1); code != 200 || d.Source != "shared" {
					t.Fatalf("decision %d: %d %+v", i, code, d)
				}
			}
			waitFor(t, "readyz ok", 30*time.Second, func() bool {
				r := p.readyz(t)
				return r["status"] == "ok" && r["store"] == tc.store
			})
			assertNoSecret(t, p, redisPW)
		})
	}
}

// TestSecureRedisWrongPasswordThenRotated: with a wrong password in the
// file the limiter starts, decides degraded and says why in /readyz; once
// the file holds the right one and the limiter gets SIGHUP, decisions turn
// shared by themselves. Neither password appears anywhere.
func TestSecureRedisWrongPasswordThenRotated(t *testing.T) {
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: redisPW, KeyPattern: "rl:*", ClientCerts: true})
	const wrong = "rw-wrong-pw-3b8e51f0c6d2a947"
	pwFile := filepath.Join(t.TempDir(), "redis-password")
	writeSecret(t, pwFile, wrong)
	p := startLimiter(t, faultPolicy, secureRedisEnv(t, certs, pwFile, r.Addr())...)

	expectDegradedBecause(t, p, "Redis refused the credentials")
	assertNoSecret(t, p, redisPW, wrong)

	writeSecret(t, pwFile, redisPW)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, "decisions turn shared after the password file is fixed and SIGHUP", 30*time.Second, func() bool {
		d, _ := p.check(t, "acct", "api", 1)
		return d.Source == "shared"
	})
	waitFor(t, "readyz ok", 30*time.Second, func() bool { return p.readyz(t)["status"] == "ok" })
	if n := p.metric(t, `limiter_secret_reloads_total{result="ok",what="redis"}`); n < 1 {
		t.Errorf("limiter_secret_reloads_total ok = %v", n)
	}
	t.Logf("shared %v after SIGHUP", took.Round(time.Millisecond))
	assertNoSecret(t, p, redisPW, wrong)
}

// TestSecureRedisWrongCAThenFixed: a CA bundle that did not sign the
// server's certificate: degraded, /readyz says the TLS handshake failed;
// the right bundle in the same file plus SIGHUP makes decisions shared.
func TestSecureRedisWrongCAThenFixed(t *testing.T) {
	t.Parallel()
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: redisPW})
	pwFile := filepath.Join(t.TempDir(), "redis-password")
	writeSecret(t, pwFile, redisPW)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, certs.OtherCAFile, caFile)
	env := append(secureRedisEnv(t, certs, pwFile, r.Addr()), "REDIS_TLS_CA_FILE="+caFile)
	p := startLimiter(t, faultPolicy, env...)

	expectDegradedBecause(t, p, "x509: certificate signed by unknown authority")
	copyFile(t, certs.CAFile, caFile)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "decisions turn shared after the CA file is fixed and SIGHUP", 30*time.Second, func() bool {
		d, _ := p.check(t, "acct", "api", 1)
		return d.Source == "shared"
	})
	assertNoSecret(t, p, redisPW)
}

// expectDegradedBecause: every decision is 200 and degraded, and /readyz
// (200, status degraded) gives a cause containing want.
func expectDegradedBecause(t *testing.T, p *limiterProc, want string) {
	t.Helper()
	for i := range 10 {
		if d, code := p.check(t, "acct", "api", 1); code != 200 || d.Source != "degraded" {
			t.Fatalf("decision %d: %d %+v, want 200 degraded", i, code, d)
		}
	}
	var ready map[string]any
	waitFor(t, "readyz gives the cause", 30*time.Second, func() bool {
		ready = p.readyz(t)
		cause, _ := ready["cause"].(string)
		return ready["httpStatus"] == 200 && ready["status"] == "degraded" && strings.Contains(cause, want)
	})
	t.Logf("readyz: %v", ready)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSecureRedisBadConfigStopsTheStart: what can be told before
// connecting — an unreadable CA, a certificate without its key — stops the
// start with one line naming the variable.
func TestSecureRedisBadConfigStopsTheStart(t *testing.T) {
	testenv.SkipShort(t) // runs the binary
	certs := testenv.NewCerts(t)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"REDIS_TLS_CA_FILE=" + filepath.Join(t.TempDir(), "missing.pem")}, "REDIS_TLS_CA_FILE"},
		{[]string{"REDIS_TLS_CERT_FILE=" + certs.ClientCert}, "REDIS_TLS_KEY_FILE"},
	} {
		cmd := exec.Command(limiterBin)
		cmd.Env = append(os.Environ(), "REDIS_ADDRS=127.0.0.1:6390", "REDIS_TLS=true", "REDIS_PASSWORD="+redisPW, "LIMITER_GRPC_ADDR=")
		cmd.Env = append(cmd.Env, tc.env...)
		out, err := cmd.CombinedOutput()
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 {
			t.Fatalf("%v: exit %v, want 2; %s", tc.env, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], tc.want) || strings.Contains(lines[0], redisPW) {
			t.Fatalf("%v: output %q, want one line naming %s (and no secret)", tc.env, out, tc.want)
		}
	}
}
