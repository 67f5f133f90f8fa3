package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestCheckShedOnARate: /check on a rate alone (burst 4, refilling one
// token in 1,000 s) with priorities: the sheddable class (share 0.5) is
// allowed twice, then answered "reason": "shed" with a retry time while
// tokens are left; critical spends the last two; then every class is
// refused for the rate, with no reason.
func TestCheckShedOnARate(t *testing.T) {
	lim := classLimiter(t)
	check := httpapi.NewCheckHandler(lim, "", nil)
	sheddable := `{"key":"acct","scope":"api","priority":"sheddable"}`
	critical := `{"key":"acct","scope":"api","priority":"critical"}`
	for i := range 2 {
		if code, d := postJSON(t, check, sheddable); code != 200 || d["allowed"] != true {
			t.Fatalf("sheddable %d within its share: %d %v", i+1, code, d)
		}
	}
	code, d := postJSON(t, check, sheddable)
	if code != 200 || d["allowed"] != false || d["reason"] != "shed" || d["remaining"].(float64) != 2 || d["retryAfterMs"].(float64) <= 0 {
		t.Fatalf("sheddable at its floor: %d %v; want shed with 2 left and a retry time", code, d)
	}
	for i := range 2 {
		if code, d := postJSON(t, check, critical); code != 200 || d["allowed"] != true {
			t.Fatalf("critical %d below the floor: %d %v", i+1, code, d)
		}
	}
	for _, body := range []string{critical, sheddable} {
		if code, d := postJSON(t, check, body); code != 200 || d["allowed"] != false || d["reason"] != nil {
			t.Fatalf("%s on the empty bucket: %d %v; want refused for the rate, no reason", body, code, d)
		}
	}
	if code, d := postJSON(t, check, `{"key":"acct","scope":"api","priority":"bulk"}`); code != 400 {
		t.Fatalf("undefined class: %d %v", code, d)
	}
}

// TestMiddlewareShedsOnARate: the middleware reads the class from the
// Ratewarden-Priority header; at its floor on a rate the sheddable class
// gets a 429 whose error code is shed, with a Retry-After; critical is
// still served.
func TestMiddlewareShedsOnARate(t *testing.T) {
	lim := classLimiter(t)
	g := &httpapi.Guard{Checker: lim, Key: httpapi.HeaderKey("X-API-Key", "key:")}
	srv := httptest.NewServer(httpapi.Middleware(g)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })))
	defer srv.Close()
	get := func(class string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", "abc")
		req.Header.Set(httpapi.PriorityHeader, class)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e errorResponse
		body, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(body, &e)
		return resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After")
	}
	for i := range 2 {
		if code, _, _ := get("sheddable"); code != 200 {
			t.Fatalf("sheddable %d within its share: %d", i+1, code)
		}
	}
	if code, errCode, retry := get("sheddable"); code != 429 || errCode != "shed" || retry == "" {
		t.Fatalf("sheddable at its floor: %d, code %q, Retry-After %q; want 429 shed with a Retry-After", code, errCode, retry)
	}
	if code, _, _ := get("critical"); code != 200 {
		t.Fatalf("critical below the floor: %d", code)
	}
}

// classLimiter is a Limiter on a fresh redis-server under a policy with
// priority classes and one rate (burst 4, refilling one token in 1,000 s,
// so that nothing refills during a test): sheddable may spend 2 tokens,
// critical all 4.
func classLimiter(t *testing.T) *enforcement.Limiter {
	t.Helper()
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\npriorities: { critical: 1, default: 1, sheddable: 0.5 }\ntiers:\n  t: { rate: 0.001, burst: 4 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "rc"), Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
