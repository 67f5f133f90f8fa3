package opsapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const admin = "admin-token-0123456789"

const docA = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n  pro: { rate: 100, burst: 200 }\n"

type api struct {
	t   *testing.T
	url string
}

func (a api) do(method, path, token, body string) (int, map[string]any) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 60 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		a.t.Fatalf("%s %s: %d %q", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

func start(t *testing.T, withLog bool) api {
	cfg := opsapi.Config{AdminToken: admin, Unavailable: "set KAFKA_BROKERS"}
	if withLog {
		k := testenv.StartKafka(t, "ratelimit.decisions", 1)
		l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		cfg.Log = l
	}
	h, err := opsapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return api{t, srv.URL}
}

func jsonBody(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestOperatorAPI walks the routes: writes answer 200 with the revision
// once applied, 409 for a conflict (naming who), 400 with every error.
func TestOperatorAPI(t *testing.T) {
	a := start(t, true)
	code, body := a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "first", "author": "alice", "expectRevision": 0}))
	if code != 200 || body["revision"] != float64(1) {
		t.Fatalf("PUT policy: %d %v", code, body)
	}
	code, body = a.do("GET", "/v1/admin/policy", admin, "")
	if code != 200 || body["revision"] != float64(1) || body["document"] != docA || body["author"] != opsapi.AdminIdentity {
		t.Fatalf("GET policy: %d %v", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA + "# b\n", "message": "stale", "author": "bob", "expectRevision": 0}))
	if e, _ := body["error"].(map[string]any); code != 409 || e["takenBy"] != opsapi.AdminIdentity {
		t.Fatalf("conflict: %d %v", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": "version: 1\ntiers:\n  free: { rate: -1, burst: 0 }\n", "message": "bad", "author": "bob"}))
	if e, _ := body["error"].(map[string]any); code != 400 || len(e["errors"].([]any)) < 2 {
		t.Fatalf("invalid: %d %v", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/overrides/acct%2F1?scope=api:search", admin, jsonBody(map[string]any{"tier": "pro", "reason": "upgrade", "author": "billing"}))
	if code != 200 || body["revision"] != float64(2) {
		t.Fatalf("PUT override: %d %v", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/overrides/acct_2", admin, jsonBody(map[string]any{"tier": "gold", "reason": "x", "author": "billing"}))
	if e, _ := body["error"].(map[string]any); code != 400 || !strings.Contains(e["message"].(string), `"gold" is not defined`) {
		t.Fatalf("undefined tier: %d %v", code, body)
	}
	code, body = a.do("GET", "/v1/admin/overrides/acct%2F1?scope=api:search", admin, "")
	if code != 200 || body["key"] != "acct/1" || body["author"] != opsapi.AdminIdentity {
		t.Fatalf("GET override: %d %v", code, body)
	}
	code, body = a.do("GET", "/v1/admin/overrides", admin, "")
	if code != 200 || len(body["overrides"].([]any)) != 1 {
		t.Fatalf("list: %d %v", code, body)
	}
	code, body = a.do("DELETE", "/v1/admin/overrides/acct%2F1?scope=api:search&reason=downgrade&author=billing", admin, "")
	if code != 200 || body["revision"] != float64(3) {
		t.Fatalf("DELETE override: %d %v", code, body)
	}
	if code, _ = a.do("GET", "/v1/admin/overrides/acct%2F1?scope=api:search", admin, ""); code != 404 {
		t.Fatalf("deleted override: %d", code)
	}
	code, body = a.do("POST", "/v1/admin/policy/rollback", admin, jsonBody(map[string]any{"revision": 1, "message": "back", "author": "alice"}))
	if code != 200 || body["revision"] != float64(4) {
		t.Fatalf("rollback: %d %v", code, body)
	}
	code, body = a.do("GET", "/v1/admin/policy/history", admin, "")
	if code != 200 || body["revision"] != float64(4) || len(body["entries"].([]any)) != 4 {
		t.Fatalf("history: %d %v", code, body)
	}
}

// TestOperatorAPIRacingWrites: two PUTs with the same expectRevision,
// exactly one applied.
func TestOperatorAPIRacingWrites(t *testing.T) {
	a := start(t, true)
	if code, body := a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "first", "author": "alice"})); code != 200 {
		t.Fatalf("%d %v", code, body)
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA + "# " + string(rune('a'+i)) + "\n", "message": "race", "author": "w", "expectRevision": 1}))
		}()
	}
	wg.Wait()
	if !(codes[0] == 200 && codes[1] == 409 || codes[0] == 409 && codes[1] == 200) {
		t.Fatalf("racing PUTs: %v", codes)
	}
}

// TestOperatorAPIAuth: only the operator's token; a valid portal token, a
// wrong token or none is 401. Without a log every route answers 503.
func TestOperatorAPIAuth(t *testing.T) {
	signer, err := usage.NewSigner([]byte("portal-secret-0123456789abcdef0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	portal, _, err := signer.Issue("acct_1", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a := start(t, false)
	for _, tok := range []string{"", portal, "wrong-token-0123456789", admin + "x"} {
		for _, route := range [][2]string{{"GET", "/v1/admin/policy"}, {"PUT", "/v1/admin/overrides/acct_1"}, {"GET", "/v1/admin/policy/history"}} {
			if code, _ := a.do(route[0], route[1], tok, "{}"); code != 401 {
				t.Errorf("%s %s with token %.8q: %d, want 401", route[0], route[1], tok, code)
			}
		}
	}
	code, body := a.do("GET", "/v1/admin/policy", admin, "")
	if e, _ := body["error"].(map[string]any); code != 503 || !strings.Contains(e["message"].(string), "KAFKA_BROKERS") {
		t.Errorf("without a log: %d %v", code, body)
	}
}

// TestOperatorAPIRollout: PUT with shadowFor and maxNewlyRejected opens a
// rollout, which GET shows; a second one while it is open is refused, and
// a bad bound is a 400.
func TestOperatorAPIRollout(t *testing.T) {
	a := start(t, true)
	if code, body := a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "first", "author": "alice"})); code != 200 {
		t.Fatalf("PUT policy: %d %v", code, body)
	}
	code, body := a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA + "# candidate\n", "message": "try", "author": "alice",
		"shadowFor": "15m", "maxNewlyRejected": 0.005}))
	if code != 200 || body["revision"] != float64(2) || !strings.Contains(body["subject"].(string), "rollout (shadow 15m0s, max 0.5%)") {
		t.Fatalf("PUT rollout: %d %v", code, body)
	}
	code, body = a.do("GET", "/v1/admin/policy", admin, "")
	ro, _ := body["rollout"].(map[string]any)
	if code != 200 || ro == nil || ro["revision"] != float64(2) || ro["maxNewlyRejected"] != 0.005 || body["documentRevision"] != float64(1) {
		t.Fatalf("GET policy during a rollout: %d %v", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA + "# another\n", "message": "again", "author": "bob",
		"shadowFor": "15m", "maxNewlyRejected": 0.005}))
	if e, _ := body["error"].(map[string]any); code != 400 || !strings.Contains(e["message"].(string), "rollout 2 is open") {
		t.Fatalf("a second rollout: %d %v", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "x", "author": "bob", "shadowFor": "15m", "maxNewlyRejected": 5}))
	if code != 400 || !strings.Contains(body["error"].(map[string]any)["message"].(string), "maxNewlyRejected") {
		t.Fatalf("a bound above 1: %d %v", code, body)
	}
}

// TestOperatorAPIPushPreview: PUT /v1/admin/policy hands the preview the
// candidate as it would be enforced (the pushed document with the
// overrides in force) and answers with what it returned; ?dryRun=true
// answers with it and writes nothing; a preview that fails never blocks
// the push.
func TestOperatorAPIPushPreview(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	var failing atomic.Bool
	h, err := opsapi.New(opsapi.Config{AdminToken: admin, Log: l,
		// Reports how the candidate resolves an overridden key and another.
		Preview: func(_ context.Context, c *policy.WithOverrides) (any, error) {
			if failing.Load() {
				return nil, errors.New("clickhouse unreachable")
			}
			a, _ := c.Resolve("acct_1", "x", "")
			b, _ := c.Resolve("acct_2", "x", "")
			return map[string]any{"acct_1": a.Burst, "acct_2": b.Burst}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	a := api{t, srv.URL}
	if code, body := a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "first", "author": "alice"})); code != 200 {
		t.Fatalf("PUT policy: %d %v", code, body)
	}
	if code, body := a.do("PUT", "/v1/admin/overrides/acct_1", admin, jsonBody(map[string]any{"tier": "pro", "reason": "deal", "author": "billing"})); code != 200 {
		t.Fatalf("PUT override: %d %v", code, body)
	}
	tighter := strings.Replace(docA, "free: { rate: 10, burst: 20 }", "free: { rate: 10, burst: 5 }", 1)
	code, body := a.do("PUT", "/v1/admin/policy?dryRun=true", admin, jsonBody(map[string]any{"document": tighter, "message": "m", "author": "bob"}))
	if pv, _ := body["preview"].(map[string]any); code != 200 || body["result"] != "dry-run" || body["revision"] != 2.0 || pv["acct_1"] != 200.0 || pv["acct_2"] != 5.0 {
		t.Fatalf("dry run: %d %v, want revision 2 unchanged, acct_1 at pro's 200 by its override, acct_2 at the candidate's 5", code, body)
	}
	code, body = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": tighter, "message": "m", "author": "bob"}))
	if pv, _ := body["preview"].(map[string]any); code != 200 || body["revision"] != 3.0 || pv["acct_2"] != 5.0 {
		t.Fatalf("push with a preview: %d %v", code, body)
	}
	failing.Store(true)
	code, body = a.do("PUT", "/v1/admin/policy", admin, jsonBody(map[string]any{"document": docA, "message": "back", "author": "bob"}))
	if pv, _ := body["preview"].(map[string]any); code != 200 || body["revision"] != 4.0 || pv["status"] != "unavailable" || pv["reason"] != "clickhouse unreachable" {
		t.Fatalf("push with the preview failing: %d %v", code, body)
	}
	if code, body := a.do("PUT", "/v1/admin/policy?dryRun=true", admin, jsonBody(map[string]any{"document": docA, "message": "m", "author": "bob"})); code != 503 {
		t.Fatalf("dry run with the preview failing: %d %v, want 503", code, body)
	}
}
