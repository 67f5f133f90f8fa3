package main

import (
	"fmt"
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
	env, pw := testenv.SecureRedisEnv(t)
	env["KAFKA_BROKERS"] = "127.0.0.1:9092"
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
