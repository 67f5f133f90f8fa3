package chconn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testcerts"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func envOf(kv []string) func(string) string {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

func ping(t *testing.T, env []string) error {
	t.Helper()
	e := envconfig.New(envOf(env))
	cfg := FromEnv(e, schema.ValidDatabase)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	conn, err := cfg.Open(Tuning{DialTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return conn.Ping(ctx)
}

// TestSecureNativePort: clickhouse-server 18.16 with tcp_port_secure and a
// password-protected user accepts the right password over TLS; a wrong
// password, an untrusted CA and TLS sent to the plaintext port are each
// explained (what to fix), and no message holds the password.
func TestSecureNativePort(t *testing.T) {
	ch := testenv.StartSecureClickHouse(t)
	dir := t.TempDir()
	wrongFile := filepath.Join(dir, "wrong")
	const wrong = "ch-WRONG-pw-77aa"
	if err := os.WriteFile(wrongFile, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.New(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(t, ch.Env(ch.PasswordFile)); err != nil {
		t.Fatalf("right password over TLS: %v", err)
	}
	cases := []struct {
		name    string
		env     []string
		kind    error
		mention string
	}{
		{"wrong password", ch.Env(wrongFile), ErrAuth, "CLICKHOUSE_PASSWORD"},
		{"untrusted CA", append(ch.Env(ch.PasswordFile), "CLICKHOUSE_TLS_CA_FILE="+other.CAFile), ErrTLS, "CLICKHOUSE_TLS_CA_FILE"},
		{"TLS to the plaintext port", append(ch.Env(ch.PasswordFile), "CLICKHOUSE_ADDR="+ch.Addr()), ErrTLS, "CLICKHOUSE_TLS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ping(t, c.env)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("ping: %v; want %v naming %s", err, c.kind, c.mention)
			}
			if strings.Contains(err.Error(), ch.Password) || strings.Contains(err.Error(), wrong) {
				t.Fatalf("error holds a password: %v", err)
			}
		})
	}
}

func TestFromEnv(t *testing.T) {
	e := envconfig.New(envOf(nil))
	c := FromEnv(e, schema.ValidDatabase)
	if e.Err() != nil || c.Addr != "127.0.0.1:9000" || c.Database != "ratelimit" || c.User != "default" || c.TLS != nil {
		t.Fatalf("defaults: %+v %v", c, e.Err())
	}
	e = envconfig.New(envOf([]string{"CLICKHOUSE_PASSWORD=s3cret-pw-value"}))
	c = FromEnv(e, schema.ValidDatabase)
	if o := c.Options(Tuning{}); o.Auth.Password != "s3cret-pw-value" {
		t.Fatalf("password not passed on")
	}
	for _, f := range []string{"%v", "%+v", "%#v"} {
		if s := sprintf(f, c); strings.Contains(s, "s3cret") {
			t.Fatalf("%s of a Config shows the password: %s", f, s)
		}
	}
	for _, bad := range [][]string{
		{"CLICKHOUSE_ADDR=nohost"}, {"CLICKHOUSE_DATABASE=bad-name"}, {"CLICKHOUSE_TLS_CA_FILE=/x.pem"},
		{"CLICKHOUSE_PASSWORD=a", "CLICKHOUSE_PASSWORD_FILE=/x"},
	} {
		e := envconfig.New(envOf(bad))
		FromEnv(e, schema.ValidDatabase)
		name, _, _ := strings.Cut(bad[0], "=")
		if err := e.Err(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

func sprintf(f string, v any) string { return fmt.Sprintf(f, v) }
