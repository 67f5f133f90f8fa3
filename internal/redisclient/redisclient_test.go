package redisclient

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// pw is the ACL user's password in these tests: long and random-looking, so
// that finding it in a message cannot be a coincidence.
const pw = "s3cr3t-Pw-5f0c2a9e7b1d4c8a"

func load(t *testing.T, env map[string]string) (Config, error) {
	t.Helper()
	e := envconfig.New(func(k string) string { return env[k] })
	c := FromEnv(e, limits.DefaultKeyPrefix)
	return c, e.Err()
}

func open(t *testing.T, env map[string]string) *Client {
	t.Helper()
	c, err := load(t, env)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.Open(Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func secureEnv(certs *testenv.Certs, addrs ...string) map[string]string {
	return map[string]string{
		"REDIS_ADDRS":           strings.Join(addrs, ","),
		"REDIS_USERNAME":        "ratewarden",
		"REDIS_PASSWORD":        pw,
		"REDIS_TLS":             "true",
		"REDIS_TLS_CA_FILE":     certs.CAFile,
		"REDIS_TLS_CERT_FILE":   certs.ClientCert,
		"REDIS_TLS_KEY_FILE":    certs.ClientKey,
		"REDIS_TLS_MIN_VERSION": "1.3",
	}
}

// roundTrip writes and reads a key under the user's key pattern.
func roundTrip(t *testing.T, cl *Client, key string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		return err
	}
	v, err := cl.Get(ctx, key).Result()
	if err == nil && v != "v" {
		err = fmt.Errorf("GET %s = %q", key, v)
	}
	return err
}

func noSecret(t *testing.T, what, s string) {
	t.Helper()
	if strings.Contains(s, pw) {
		t.Fatalf("%s contains the password: %s", what, s)
	}
}

// TestTLSAndACL: a TLS-only server with an ACL user and client
// certificates required: the client built from the environment talks to
// it; a wrong password, a wrong CA and a missing client certificate each
// fail with a reason that says what to check and holds no secret.
func TestTLSAndACL(t *testing.T) {
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: pw,
		KeyPattern: "rl:*", ClientCerts: true})
	env := secureEnv(certs, r.Addr())

	cl := open(t, env)
	if cl.Kind() != KindStandalone {
		t.Fatalf("kind %q", cl.Kind())
	}
	if err := roundTrip(t, cl, "rl:ok"); err != nil {
		t.Fatalf("over TLS as the ACL user: %v", err)
	}
	ctx := context.Background()
	if why := cl.Diagnose(ctx); why != "" {
		t.Fatalf("Diagnose of a working connection: %q", why)
	}
	// The ACL holds: keys outside rl:* are refused (so the user is really
	// the one in use, not a default with every right).
	if err := cl.Set(ctx, "other", "v", time.Minute).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("SET outside the key pattern: %v, want NOPERM", err)
	}

	cases := []struct {
		name string
		set  map[string]string
		want string
	}{
		{"wrong password", map[string]string{"REDIS_PASSWORD": "not-" + pw}, "Redis refused the credentials"},
		{"wrong CA", map[string]string{"REDIS_TLS_CA_FILE": certs.OtherCAFile}, "TLS to Redis failed"},
		{"no client certificate", map[string]string{"REDIS_TLS_CERT_FILE": "", "REDIS_TLS_KEY_FILE": ""}, "TLS to Redis failed"},
		{"wrong server name", map[string]string{"REDIS_TLS_SERVER_NAME": "redis.example.com"}, "TLS to Redis failed"},
		{"plain text to a TLS port", map[string]string{"REDIS_TLS": "", "REDIS_TLS_CA_FILE": "", "REDIS_TLS_CERT_FILE": "",
			"REDIS_TLS_KEY_FILE": "", "REDIS_TLS_MIN_VERSION": ""}, "Redis"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := map[string]string{}
			for k, v := range env {
				bad[k] = v
			}
			for k, v := range tc.set {
				bad[k] = v
			}
			cl := open(t, bad)
			err := roundTrip(t, cl, "rl:bad")
			if err == nil {
				t.Fatal("accepted")
			}
			noSecret(t, "the error", err.Error())
			why := cl.Diagnose(ctx)
			if !strings.Contains(why, tc.want) {
				t.Fatalf("Diagnose = %q, want it to say %q", why, tc.want)
			}
			noSecret(t, "Diagnose", why)
			t.Logf("%s: %s", tc.name, why)
		})
	}
}

// TestPasswordRotationThroughTheFile: the password comes from
// REDIS_PASSWORD_FILE; after Redis and the file change, Reload (what SIGHUP
// calls) makes new connections use the new one without a new client.
func TestPasswordRotationThroughTheFile(t *testing.T) {
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: pw})
	file := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := secureEnv(certs, r.Addr())
	delete(env, "REDIS_PASSWORD")
	env["REDIS_PASSWORD_FILE"] = file
	cl := open(t, env)
	if err := roundTrip(t, cl, "rl:a"); err != nil {
		t.Fatal(err)
	}

	const next = pw + "-rotated"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.RotatePassword(ctx, next); err != nil {
		t.Fatal(err)
	}
	// New connections still use the old password: refused.
	cl.diag = diagnosis{}
	if why := cl.Diagnose(ctx); !strings.Contains(why, "refused the credentials") {
		t.Fatalf("before the file changes: Diagnose = %q", why)
	}
	if err := os.WriteFile(file, []byte(next+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cl.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(t, cl, "rl:b"); err != nil {
		t.Fatalf("after Reload: %v", err)
	}
	// A file that cannot be read keeps the password in force.
	os.Remove(file)
	err := cl.Reload()
	if err == nil || !strings.Contains(err.Error(), "REDIS_PASSWORD_FILE") {
		t.Fatalf("Reload of a missing file: %v", err)
	}
	noSecret(t, "Reload's error", err.Error())
	if err := roundTrip(t, cl, "rl:c"); err != nil {
		t.Fatalf("after a failed Reload: %v", err)
	}
}

// TestClusterOverTLSWithACL: a Redis Cluster whose nodes speak TLS only
// (client port and bus) and require the ACL user: the cluster client gets
// the same TLS configuration and credentials for every node it is
// redirected to.
func TestClusterOverTLSWithACL(t *testing.T) {
	certs := testenv.NewCerts(t)
	c := testenv.StartSecureCluster(t, 3, testenv.Secure{Certs: certs, User: "ratewarden", Password: pw, ClientCerts: true})
	cl := open(t, secureEnv(certs, c.Addrs()...))
	if cl.Kind() != KindCluster {
		t.Fatalf("kind %q", cl.Kind())
	}
	// Keys in every slot range: the client follows the slot map to each
	// master over TLS.
	for i := range 30 {
		if err := roundTrip(t, cl, fmt.Sprintf("rl:{k%d}", i)); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if why := cl.Diagnose(context.Background()); why != "" {
		t.Fatalf("Diagnose: %q", why)
	}
}

// TestConfigErrorsNameTheVariable: what can be told at start stops the
// start, naming the variable, and never quoting a secret.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	certs := testenv.NewCerts(t)
	missing := filepath.Join(t.TempDir(), "nope.pem")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"unreadable CA", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CA_FILE": missing}, "REDIS_TLS_CA_FILE"},
		{"CA without a certificate", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CA_FILE": notPEM}, "REDIS_TLS_CA_FILE"},
		{"certificate without key", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CERT_FILE": certs.ClientCert}, "REDIS_TLS_KEY_FILE"},
		{"key without certificate", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_KEY_FILE": certs.ClientKey}, "REDIS_TLS_CERT_FILE"},
		{"key of another certificate", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CERT_FILE": certs.ClientCert,
			"REDIS_TLS_KEY_FILE": certs.ServerKey}, "REDIS_TLS_CERT_FILE"},
		{"missing key file", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CERT_FILE": certs.ClientCert,
			"REDIS_TLS_KEY_FILE": missing}, "REDIS_TLS_KEY_FILE"},
		{"TLS files without REDIS_TLS", map[string]string{"REDIS_TLS_CA_FILE": certs.CAFile}, "REDIS_TLS_CA_FILE"},
		{"bad REDIS_TLS", map[string]string{"REDIS_TLS": "maybe"}, "REDIS_TLS"},
		{"old TLS version", map[string]string{"REDIS_TLS": "true", "REDIS_TLS_MIN_VERSION": "1.0"}, "REDIS_TLS_MIN_VERSION"},
		{"password and its file", map[string]string{"REDIS_PASSWORD": pw, "REDIS_PASSWORD_FILE": missing}, "REDIS_PASSWORD"},
		{"unreadable password file", map[string]string{"REDIS_PASSWORD_FILE": missing}, "REDIS_PASSWORD_FILE"},
		{"sentinel without addresses", map[string]string{"REDIS_SENTINEL_MASTER": "m"}, "REDIS_SENTINEL_MASTER"},
		{"bad address", map[string]string{"REDIS_ADDRS": "redis", "REDIS_PASSWORD": pw}, "REDIS_ADDRS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
			noSecret(t, "the error", err.Error())
		})
	}
	// A Config printed by mistake shows no password.
	c, err := load(t, map[string]string{"REDIS_ADDRS": "127.0.0.1:6379", "REDIS_PASSWORD": pw, "REDIS_SENTINEL_PASSWORD": pw})
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		noSecret(t, "a printed Config", fmt.Sprintf(verb, c))
	}
}

// TestDiagnosisWaitsOnlyAsLongAsItsCaller: a probe slower than the caller's
// wait does not hold the caller up: the caller gets the previous answer
// (or says none came yet), the probe finishes in the background and
// answers the next call, and calls while it runs start no second probe.
func TestDiagnosisWaitsOnlyAsLongAsItsCaller(t *testing.T) {
	var d diagnosis
	release := make(chan struct{})
	var probes atomic.Int32
	slow := func(ctx context.Context) string {
		probes.Add(1)
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the probe has no deadline")
		}
		<-release
		return "Redis did not answer: connection refused"
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel() // a caller that waits for nothing
	for range 3 {
		if why := d.get(gone, slow); why != notYet {
			t.Fatalf("while the first probe is out: %q, want %q", why, notYet)
		}
	}
	close(release)
	wait, cancelWait := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelWait()
	if why := d.get(wait, slow); why != "Redis did not answer: connection refused" {
		t.Fatalf("after the probe answered: %q", why)
	}
	if n := probes.Load(); n != 1 {
		t.Fatalf("%d probes ran, want 1 (one at a time, its answer kept for a second)", n)
	}

	// An answer older than a second is renewed; a caller that cannot wait
	// gets the previous one meanwhile.
	d.mu.Lock()
	d.at = time.Now().Add(-2 * time.Second)
	d.mu.Unlock()
	block := make(chan struct{})
	renewed := func(context.Context) string { <-block; return "" }
	if why := d.get(gone, renewed); why != "Redis did not answer: connection refused" {
		t.Fatalf("while renewing: %q, want the previous answer", why)
	}
	close(block)
	if why := d.get(wait, renewed); why != "" {
		t.Fatalf("after Redis answered: %q, want \"\"", why)
	}
}

// A TLS 1.3 server that refuses the client certificate closes the
// connection after the client's handshake has succeeded, and the first
// command may see the close (a reset, a broken pipe, EOF) instead of the
// alert: that is still a TLS diagnosis, never "did not answer".
func TestExplainACloseAfterTheHandshake(t *testing.T) {
	creds := &credentials{}
	empty := ""
	creds.pw.Store(&empty)
	withTLS, plain := &Client{creds: creds, tls: &dialer{}}, &Client{creds: creds}
	for _, msg := range []string{
		"write tcp 127.0.0.1:41644->127.0.0.1:40185: write: connection reset by peer",
		"write tcp 127.0.0.1:41644->127.0.0.1:40185: write: broken pipe",
		"EOF",
	} {
		if why := withTLS.explain(fmt.Errorf("%s", msg)); !strings.Contains(why, "TLS to Redis failed") {
			t.Errorf("TLS client, %q: %q", msg, why)
		}
		if why := plain.explain(fmt.Errorf("%s", msg)); !strings.Contains(why, "REDIS_TLS=true") {
			t.Errorf("plain client, %q: %q", msg, why)
		}
	}
}
