package main

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/otlptest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestUsageRequestAndQuerySpans: a GET /v1/usage carrying a traceparent
// produces, at a real OTLP/HTTP receiver, the usage API's server span in
// that trace and a ClickHouse query span under it, whose statement holds
// placeholders, never the key asked for.
func TestUsageRequestAndQuerySpans(t *testing.T) {
	t.Parallel()
	rcv := otlptest.StartHTTP(t)
	ch := testenv.StartClickHouse(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	const admin = "e2e-admin-token-0123456789"
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+ch.Database(t),
		"POLICY_FILE="+policy, "USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.Endpoint(), "OTEL_BSP_SCHEDULE_DELAY=100")
	q := url.Values{"key": {"acct_secret_42"}, "window": {"hour"}, "from": {time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)},
		"to": {time.Now().UTC().Format(time.RFC3339)}}
	req, _ := http.NewRequest(http.MethodGet, api.url+"/v1/usage?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	const traceID = "6bf92f3577b34da6a3ce929d0e0e4738"
	req.Header.Set("traceparent", "00-"+traceID+"-20f067aa0ba902b9-01")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/usage: %d", resp.StatusCode)
	}
	var server, query otlptest.Span
	rcv.Wait(t, "the request's span and its query's", 60*time.Second, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.TraceID == traceID && s.Name == "GET" {
				server = s
			}
		}
		for _, s := range spans {
			if s.TraceID == traceID && server.SpanID != "" && s.ParentSpanID == server.SpanID && s.Name == "clickhouse SELECT" {
				query = s
				return true
			}
		}
		return false
	})
	if server.Service != "usage-api" || server.ParentSpanID != "20f067aa0ba902b9" || server.Attributes["http.response.status_code"] != "200" {
		t.Errorf("server span %+v", server)
	}
	if text := query.Attributes["db.query.text"]; !strings.Contains(text, "?") || strings.Contains(text, "acct_secret_42") || query.Attributes["db.system.name"] != "clickhouse" {
		t.Errorf("query span attributes %v: want the statement with placeholders and no key", query.Attributes)
	}
	for _, s := range rcv.Spans() {
		for k, v := range s.Attributes {
			if strings.Contains(v, "acct_secret_42") {
				t.Errorf("span %q attribute %s carries the key", s.Name, k)
			}
		}
	}
}
