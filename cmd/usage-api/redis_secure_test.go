package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestRedisOverTLSWithACL: the binary's Redis client, built from its
// environment as run builds it, talks to a TLS-only Redis (client
// certificates required) as an ACL user limited to the limiters' keys,
// with the password given as a file; and the configuration says nothing
// of the password when printed.
func TestRedisOverTLSWithACL(t *testing.T) {
	t.Parallel()
	env, pw := testenv.SecureRedisEnv(t)
	env["USAGE_ADMIN_TOKEN"] = "admin-token-0123456789"
	env["USAGE_TOKEN_SECRET"] = "secret-0123456789abcdef"
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := cfg.Redis.Open(redisOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	testenv.ExpectSecureRedisWorks(t, rdb)
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
