package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// storesPolicy routes every key of its tier to the named store vip.
const storesPolicy = `version: 1
default_tier: vip
tiers:
  vip: { rate: 1, period: hour, burst: 5, store: vip }
`

// TestSupportInspectReadsTheNamedStore: with REDIS_STORES, the support
// page's inspect reads a key's bucket in the store its limit names, as
// the limiter decided it there: a limiter (REDIS_ADDRS one redis-server,
// REDIS_STORES=vip=another) spends the key's bucket in vip, and the usage
// API, given the same variables, shows it spent (the default store holds
// no bucket of the key, which would read full); a read-only operator's
// refused reset is audited on the key's list in vip, where inspect reads
// it.
func TestSupportInspectReadsTheNamedStore(t *testing.T) {
	t.Parallel()
	def, vip := testenv.StartRedis(t), testenv.StartRedis(t)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	dir := t.TempDir()
	const (
		admin     = "stores-admin-token-0123456789"
		limToken  = "stores-limiter-token-0123456789"
		ritaToken = "stores-rita-token-0123456789"
	)
	pol, tokens := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "tokens")
	for path, content := range map[string]string{pol: storesPolicy, tokens: "rita read " + ritaToken + "\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	redisEnv := []string{"REDIS_ADDRS=" + def.Addr(), "REDIS_STORES=vip=" + vip.Addr(), "POLICY_FILE=" + pol}
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", append(redisEnv, "LIMITER_AUTH_TOKEN="+limToken, "LIMITER_GRPC_ADDR=")...)
	api := start(t, "usage-api", "USAGE_API_ADDR", "/healthz", append(redisEnv, "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db,
		"USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=stores-secret-0123456789abcdef",
		"LIMITER_FLEET_URLS="+limiter.url, "LIMITER_AUTH_TOKEN="+limToken, "USAGE_ADMIN_TOKENS_FILE="+tokens)...)

	for i := 0; ; i++ {
		code, b := call(t, "POST", limiter.url+"/check", limToken, `{"key":"acct_vip","scope":"api"}`)
		var d struct{ Allowed bool }
		if code != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("check: %d %s", code, b)
		}
		if !d.Allowed {
			break
		}
		if i > 10 {
			t.Fatal("never rejected")
		}
	}
	if code, b := call(t, "POST", api.url+"/v1/admin/keys/reset", ritaToken, `{"key":"acct_vip","scope":"api","op":"refill","reason":"looks wrong"}`); code != 403 ||
		strings.Contains(string(b), "not audited") || strings.Contains(string(b), "could not be audited") {
		t.Fatalf("a read-only operator's reset: %d %s, want 403 and audited", code, b)
	}
	code, b := call(t, "GET", api.url+"/v1/admin/keys/inspect?key=acct_vip&scope=api", admin, "")
	var rep support.Report
	if code != 200 || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("inspect: %d %s", code, b)
	}
	var refusal support.Audit
	if len(rep.Resets) != 1 || json.Unmarshal(rep.Resets[0], &refusal) != nil || refusal.Author != "rita" || refusal.Code != support.CodeForbidden {
		t.Fatalf("resets %s (error %q), want rita's refusal, audited in vip", rep.Resets, rep.ResetsError)
	}
	if rep.Rule.Rule == nil || rep.Rule.Limit.Store != "vip" {
		t.Fatalf("rule %+v (error %q), want the limit of store vip", rep.Rule.Rule, rep.Rule.Error)
	}
	if rep.Bucket.Error != "" || rep.Bucket.BucketView == nil || rep.Bucket.Capacity != 5 || rep.Bucket.Tokens >= 1 {
		t.Fatalf("bucket %+v (error %q), want vip's spent bucket of 5", rep.Bucket.BucketView, rep.Bucket.Error)
	}
}
