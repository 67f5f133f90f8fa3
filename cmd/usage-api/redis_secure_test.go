package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/testenv"
)

// TestRedisOverTLSWithACL: the binary's Redis client, built from its
// environment as run builds it, talks to a TLS-only Redis (client
// certificates required) as an ACL user limited to the limiters' keys,
// with the password given as a file; and the configuration says nothing
// of the password when printed.
func TestRedisOverTLSWithACL(t *testing.T) {
	const pw = "rw-redis-pw-71c04e9a5d3b"
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: pw, KeyPattern: "rl:*", ClientCerts: true})
	pwFile := t.TempDir() + "/redis-password"
	writeFileT(t, pwFile, pw+"\n")
	env := map[string]string{
		"USAGE_ADMIN_TOKEN": "admin-token-0123456789", "USAGE_TOKEN_SECRET": "secret-0123456789abcdef",
		"REDIS_ADDRS":         r.Addr(),
		"REDIS_USERNAME":      "ratewarden",
		"REDIS_PASSWORD_FILE": pwFile,
		"REDIS_TLS":           "true",
		"REDIS_TLS_CA_FILE":   certs.CAFile,
		"REDIS_TLS_CERT_FILE": certs.ClientCert,
		"REDIS_TLS_KEY_FILE":  certs.ClientKey,
	}
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := cfg.Redis.Open(redisOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A script, as the binary's own Redis work is (the reconciler's raise,
	// the quota view's reads).
	n, err := rdb.Eval(ctx, "return redis.call('INCRBY', KEYS[1], ARGV[1])", []string{"rl:{acct}:q:test"}, 3).Int64()
	if err != nil || n != 3 {
		t.Fatalf("EVAL over TLS as the ACL user: %d %v", n, err)
	}
	if why := rdb.Diagnose(ctx); why != "" {
		t.Fatalf("Diagnose: %s", why)
	}
	if s := fmt.Sprintf("%+v %#v", cfg, cfg); strings.Contains(s, pw) {
		t.Fatal("the printed configuration holds the password")
	}
}

func writeFileT(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
