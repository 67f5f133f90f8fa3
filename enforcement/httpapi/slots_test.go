package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// slotGate is a Gate over a limiter, both on a fresh Redis: concurrency 2
// on scope "GET /report" of every key, priorities with sheddable at half.
func slotGate(t *testing.T, ttl time.Duration) (*slots.Gate, *redisstore.Concurrency, *redis.Client) {
	t.Helper()
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	pol, err := policy.Parse([]byte(`version: 1
default_tier: t
priorities: { critical: 1, default: 1, sheddable: 0.5 }
tiers:
  t: { rate: 1000, burst: 1000 }
rules:
  - { name: reports, scope: "GET /report", concurrency: 2 }
`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "h"), Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	c := redisstore.NewConcurrency(rdb, "h")
	g, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: c, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return g, c, rdb
}

func held(t *testing.T, c *redisstore.Concurrency, rdb *redis.Client, key string) int64 {
	t.Helper()
	n, err := c.Held(context.Background(), rdb, key, "GET /report")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func postJSON(t *testing.T, h http.Handler, body string) (int, map[string]any) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)))
	var out map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("%q: %v", w.Body.String(), err)
	}
	return w.Code, out
}

// TestCheckReleaseRenew: /check's answer carries the lease; /release
// frees it once and answers a second release without freeing anything;
// /renew extends a held lease and answers 404 for one not held; a
// rejection for want of a slot says "concurrency", a shed one "shed".
func TestCheckReleaseRenew(t *testing.T) {
	g, c, rdb := slotGate(t, time.Minute)
	check := httpapi.NewCheckHandler(g, "", nil)
	leases := httpapi.NewLeaseHandler(g, "", nil)
	body := `{"key":"acct","scope":"GET /report","priority":"sheddable"}`
	code, d := postJSON(t, check, body)
	lease, _ := d["lease"].(string)
	if code != 200 || d["allowed"] != true || lease == "" || d["leaseExpiresAt"] == nil {
		t.Fatalf("check: %d %v", code, d)
	}
	if end, err := time.Parse(time.RFC3339Nano, d["leaseExpiresAt"].(string)); err != nil || !end.After(time.Now()) {
		t.Fatalf("leaseExpiresAt %v: %v", d["leaseExpiresAt"], err)
	}
	if code, d := postJSON(t, check, body); code != 200 || d["allowed"] != false || d["reason"] != "shed" {
		t.Fatalf("sheddable past its share: %d %v", code, d)
	}
	if code, d := postJSON(t, check, `{"key":"acct","scope":"GET /report","priority":"critical"}`); code != 200 || d["allowed"] != true {
		t.Fatalf("critical: %d %v", code, d)
	}
	if code, d := postJSON(t, check, `{"key":"acct","scope":"GET /report","priority":"critical"}`); code != 200 || d["allowed"] != false || d["reason"] != "concurrency" || d["retryAfterMs"].(float64) <= 0 {
		t.Fatalf("past the limit: %d %v", code, d)
	}
	if code, d := postJSON(t, check, `{"key":"acct","scope":"GET /report","priority":"bulk"}`); code != 400 {
		t.Fatalf("undefined class: %d %v", code, d)
	}
	if code, d := postJSON(t, leases.Renew(), `{"lease":"`+lease+`"}`); code != 200 || d["renewed"] != true {
		t.Fatalf("renew: %d %v", code, d)
	}
	if code, d := postJSON(t, leases.Release(), `{"lease":"`+lease+`"}`); code != 200 || d["released"] != true {
		t.Fatalf("release: %d %v", code, d)
	}
	if n := held(t, c, rdb, "acct"); n != 1 {
		t.Fatalf("%d held after a release, want 1", n)
	}
	if code, d := postJSON(t, leases.Release(), `{"lease":"`+lease+`"}`); code != 200 || d["released"] != false {
		t.Fatalf("second release: %d %v", code, d)
	}
	if n := held(t, c, rdb, "acct"); n != 1 {
		t.Fatalf("%d held after a second release, want 1", n)
	}
	if code, d := postJSON(t, leases.Renew(), `{"lease":"`+lease+`"}`); code != 404 || d["error"].(map[string]any)["code"] != "lease_not_found" {
		t.Fatalf("renew after release: %d %v", code, d)
	}
	for _, bad := range []string{`{}`, `{"lease":""}`, `{"lease":7}`, `{"lease":"nope"}`, `[`} {
		if code, d := postJSON(t, leases.Release(), bad); code != 400 {
			t.Fatalf("release %s: %d %v", bad, code, d)
		}
	}
}

// TestMiddlewareHoldsTheSlot: the middleware holds a slot while the
// handler runs — renewed past several lease times — and gives it back
// when the handler returns or panics; a request past the limit is 429.
func TestMiddlewareHoldsTheSlot(t *testing.T) {
	g, c, rdb := slotGate(t, 3*time.Second) // renewed every second
	inside := make(chan struct{})
	leave := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("panic") != "" {
			panic("handler failed")
		}
		inside <- struct{}{}
		<-leave
		if err := context.Cause(r.Context()); err != nil {
			t.Errorf("the held request's context ended: %v", err)
		}
	})
	guard := &httpapi.Guard{Checker: g, Key: httpapi.HeaderKey("X-Key", "k:")}
	srv := httptest.NewUnstartedServer(httpapi.Middleware(guard)(mux))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics below are the test's
	srv.Start()
	defer srv.Close()
	get := func(query string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/report"+query, nil)
		req.Header.Set("X-Key", "a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0 // the panic closed the connection
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	codes := make(chan int, 2)
	for range 2 {
		go func() { codes <- get("") }()
		<-inside
	}
	if n := held(t, c, rdb, "k:a"); n != 2 {
		t.Fatalf("%d held while two handlers run", n)
	}
	if code := get(""); code != http.StatusTooManyRequests {
		t.Fatalf("third request: %d", code)
	}
	// Held past two lease times: renewed, never lost.
	start, _ := rdb.Time(context.Background()).Result()
	for {
		now, _ := rdb.Time(context.Background()).Result()
		if now.Sub(start) > 7*time.Second {
			break
		}
		if n := held(t, c, rdb, "k:a"); n != 2 {
			t.Fatalf("%d held %v into the handlers", n, now.Sub(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(leave)
	for range 2 {
		if code := <-codes; code != 200 {
			t.Fatalf("held request answered %d", code)
		}
	}
	if n := held(t, c, rdb, "k:a"); n != 0 {
		t.Fatalf("%d held after the handlers returned", n)
	}
	for range 3 {
		get("?panic=1")
		if n := held(t, c, rdb, "k:a"); n != 0 {
			t.Fatalf("%d held after a handler panicked", n)
		}
	}
}

// TestMiddlewareLeaseLost: when the store no longer holds the request's
// lease (here its set is deleted, as a frozen store outlived by the lease
// would leave it), the next renewal cancels the handler's context with
// ErrLeaseLost.
func TestMiddlewareLeaseLost(t *testing.T) {
	g, c, rdb := slotGate(t, time.Second)
	cause := make(chan error, 1)
	inside := make(chan struct{})
	h := httpapi.Middleware(&httpapi.Guard{Checker: g, Key: httpapi.HeaderKey("X-Key", "k:")})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inside)
		select {
		case <-r.Context().Done():
			cause <- context.Cause(r.Context())
		case <-time.After(time.Minute):
			cause <- errors.New("never cancelled")
		}
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	go func() {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/report", nil)
		req.Header.Set("X-Key", "b")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-inside
	if err := rdb.Del(context.Background(), c.SetKey("k:b", "GET /report")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, httpapi.ErrLeaseLost) {
		t.Fatalf("the handler's context ended with %v", err)
	}
}

// TestMiddlewarePriorityHeader: the middleware reads the class from
// Ratewarden-Priority; a sheddable request past its share is a 429 with
// code "shed" and an honest Retry-After, one past the limit
// "concurrency_limited", and critical traffic keeps the rest.
func TestMiddlewarePriorityHeader(t *testing.T) {
	g, _, _ := slotGate(t, time.Minute)
	release := make(chan struct{})
	inside := make(chan struct{}, 4)
	h := httpapi.Middleware(&httpapi.Guard{Checker: g, Key: httpapi.HeaderKey("X-Key", "k:")})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- struct{}{}
		<-release
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer close(release)
	do := func(priority string) (int, string, map[string]any) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/report", nil)
		req.Header.Set("X-Key", "p")
		if priority != "" {
			req.Header.Set(httpapi.PriorityHeader, priority)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, "", nil
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), body
	}
	go do("sheddable") // holds 1 of 2: the sheddable share
	<-inside
	code, retry, body := do("sheddable")
	if errBody, _ := body["error"].(map[string]any); code != 429 || errBody["code"] != "shed" || retry == "" || retry == "0" {
		t.Fatalf("sheddable past its share: %d, Retry-After %q, %v", code, retry, body)
	}
	go do("critical") // the second slot
	<-inside
	code, _, body = do("critical")
	if errBody, _ := body["error"].(map[string]any); code != 429 || errBody["code"] != "concurrency_limited" {
		t.Fatalf("critical past the limit: %d %v", code, body)
	}
}
