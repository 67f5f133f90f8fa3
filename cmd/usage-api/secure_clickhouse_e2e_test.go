package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestSecureClickHouse: ClickHouse 18.16 reached on its secure native port
// (TLS, the test's CA) as a password-protected user. With a WRONG password
// the meter-consumer and the usage API answer /readyz 503 with a reason
// that names CLICKHOUSE_PASSWORD (and never a password); with the right one
// (from a file) both work: decisions sent to the limiter are counted by the
// usage API exactly.
func TestSecureClickHouse(t *testing.T) {
	t.Parallel()
	ch := testenv.StartSecureClickHouse(t)
	db := ch.Database(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 2)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	const wrong = "ch-WRONG-pw-5e0b7"
	wrongFile := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrongFile, []byte(wrong+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const admin = "secure-admin-token-0123456789"
	common := []string{"KAFKA_BROKERS=" + kafka.Addr(), "KAFKA_TOPIC=" + kafka.Topic(), "CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy}
	apiEnv := []string{"USAGE_ADMIN_TOKEN=" + admin, "USAGE_TOKEN_SECRET=secure-signing-secret-0123456789"}

	t.Run("wrong password", func(t *testing.T) {
		meter := start(t, "meter-consumer", "METER_ADDR", "/healthz", append(append(common, ch.Env(wrongFile)...), "METER_BATCH_WAIT=50ms")...)
		api := start(t, "usage-api", "USAGE_API_ADDR", "/healthz", append(append(common, ch.Env(wrongFile)...), apiEnv...)...)
		for _, p := range []*proc{meter, api} {
			var body string
			eventually(t, time.Minute, p.name+" /readyz never named the refused login: "+body, func() bool {
				code, b := call(t, "GET", p.url+"/readyz", "", "")
				body = string(b)
				return code == 503 && strings.Contains(body, "refused the login") && strings.Contains(body, "CLICKHOUSE_PASSWORD")
			})
			if strings.Contains(body, wrong) || strings.Contains(body, ch.Password) {
				t.Fatalf("%s /readyz holds a password: %s", p.name, body)
			}
		}
	})

	meter := start(t, "meter-consumer", "METER_ADDR", "/readyz", append(append(common, ch.Env(ch.PasswordFile)...), "METER_BATCH_WAIT=50ms")...)
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(append(common, ch.Env(ch.PasswordFile)...), apiEnv...)...)
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", common...)
	const n = 12
	for i := 0; i < n; i++ {
		if code, b := call(t, "POST", limiter.url+"/check", "", `{"key":"acct_tls","scope":"api:read"}`); code != 200 {
			t.Fatalf("check: %d %s", code, b)
		}
	}
	q := url.Values{"key": {"acct_tls"}, "window": {"day"},
		"from": {time.Now().UTC().Add(-48 * time.Hour).Format(time.RFC3339)}, "to": {time.Now().UTC().Add(48 * time.Hour).Format(time.RFC3339)}}
	var got uint64
	eventually(t, 2*time.Minute, "the usage API never reported the decisions", func() bool {
		code, b := call(t, "GET", api.url+"/v1/usage?"+q.Encode(), admin, "")
		if code != 200 {
			t.Fatalf("usage: %d %s", code, b)
		}
		var u struct{ Series []struct{ Requests uint64 } }
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatal(err)
		}
		got = 0
		for _, s := range u.Series {
			got += s.Requests
		}
		if got > n {
			t.Fatalf("usage reports %d requests, more than the %d sent", got, n)
		}
		return got == n
	})
	for _, p := range []*proc{limiter, meter, api} {
		p.stop(t)
	}
	_ = fmt.Sprint
}
