package main

import (
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	ok := map[string]string{"USAGE_ADMIN_TOKEN": "admin-token-0123456789", "USAGE_TOKEN_SECRET": "secret-0123456789abcdef"}
	c, err := loadConfig(env(ok))
	if err != nil || c.Addr != "127.0.0.1:8081" || c.ClickHouse.Addr != "127.0.0.1:9000" || c.ClickHouse.Database != "ratelimit" ||
		c.PolicyFile != "deploy/policy.yaml" || c.QueryTimeout != 10*time.Second {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"USAGE_ADMIN_TOKEN": ""}, "USAGE_ADMIN_TOKEN: required"},
		{map[string]string{"USAGE_TOKEN_SECRET": ""}, "USAGE_TOKEN_SECRET: required"},
		{map[string]string{"USAGE_TOKEN_SECRET": "short"}, "USAGE_TOKEN_SECRET: must be at least 16 bytes"},
		{map[string]string{"USAGE_ADMIN_TOKEN": "admin"}, "USAGE_ADMIN_TOKEN: must be at least 16 bytes"},
		{map[string]string{"USAGE_API_ADDR": "8081"}, "USAGE_API_ADDR:"},
		{map[string]string{"CLICKHOUSE_ADDR": "host:99999"}, "CLICKHOUSE_ADDR:"},
		{map[string]string{"CLICKHOUSE_DATABASE": "rl; DROP"}, "CLICKHOUSE_DATABASE:"},
		{map[string]string{"USAGE_QUERY_TIMEOUT": "forever"}, "USAGE_QUERY_TIMEOUT:"},
		{map[string]string{"REDIS_ADDRS": "nohost"}, "REDIS_ADDRS:"},
		{map[string]string{"USAGE_TOKEN_SECRET": "admin-token-0123456789"}, "must differ"},
	} {
		m := map[string]string{}
		for k, v := range ok {
			m[k] = v
		}
		for k, v := range tc.set {
			m[k] = v
		}
		_, err := loadConfig(env(m))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want one line containing %q", tc.set, err, tc.want)
		}
	}
}
