package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering/notify"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestSoftLimitWebhookThroughBinaries: decisions that cross a soft limit,
// sent through the limiter, reach a verifying receiver as exactly one
// signed webhook from the meter-consumer's notifier, and the operator reads
// the attempt through the usage-api.
func TestSoftLimitWebhookThroughBinaries(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	key, _ := notify.ParseSecret(secret)
	var mu sync.Mutex
	var got []map[string]any
	bad := 0
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := notify.Verify(key, r.Header, body, time.Now(), 5*time.Minute); err != nil {
			bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		got = append(got, m)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	received := func() ([]map[string]any, int) {
		mu.Lock()
		defer mu.Unlock()
		return append([]map[string]any(nil), got...), bad
	}

	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 4)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"KAFKA_BROKERS=" + kafka.Addr(), "KAFKA_TOPIC=" + kafka.Topic(), "CLICKHOUSE_ADDR=" + ch.Addr(),
		"CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy}
	start(t, "meter-consumer", "METER_ADDR", "/readyz", append(common, "METER_BATCH_WAIT=50ms",
		"WEBHOOK_URL="+rcv.URL+"/hooks/ratelimit", "WEBHOOK_SECRET="+secret)...)
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", common...)
	const admin = "e2e-admin-token-0123456789"
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(common, "USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef")...)

	warned := 0
	for i := 0; i < 12; i++ {
		code, b := call(t, "POST", limiter.url+"/check", "", `{"key":"acct_free","scope":"api:read"}`)
		var d struct{ Warning bool }
		if code != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("check: %d %s", code, b)
		}
		if d.Warning {
			warned++
		}
	}
	if warned < 2 {
		t.Fatalf("%d warned decisions; the policy's soft limit (50%%) should warn several", warned)
	}
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		code, b := call(t, "GET", api.url+"/v1/admin/webhook-deliveries?"+url.Values{"key": {"acct_free"}}.Encode(), admin, "")
		var v struct {
			Attempts []struct{ Outcome, Scope, URL string }
		}
		_ = json.Unmarshal(b, &v)
		if code == 200 && len(v.Attempts) == 1 && v.Attempts[0].Outcome == "delivered" && v.Attempts[0].Scope == "api:read" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no delivered attempt visible to the operator: %d %s", code, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Every event has been read by both groups once the usage shows them;
	// then the receiver still has exactly one webhook.
	for {
		code, b := call(t, "GET", api.url+"/v1/usage?key=acct_free&window=minute", admin, "")
		var u struct{ Totals struct{ Requests int } }
		_ = json.Unmarshal(b, &u)
		if code == 200 && u.Totals.Requests == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage: %d %s", code, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	hooks, badSig := received()
	if len(hooks) != 1 || badSig != 0 {
		t.Fatalf("receiver: %d webhooks, %d badly signed; want exactly 1", len(hooks), badSig)
	}
	data, _ := hooks[0]["data"].(map[string]any)
	if hooks[0]["type"] != notify.EventType || data["key"] != "acct_free" || data["scope"] != "api:read" || data["tier"] != "free" {
		t.Fatalf("webhook body %v", hooks[0])
	}
}
