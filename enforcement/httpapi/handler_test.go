package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// testPolicy's limits that the tests exhaust refill one token an hour: no
// whole token comes back while a test runs, however slow the machine, so
// remaining counts are exact and retry times are known up to the time the
// test itself took.
const testPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 5, soft_limit_percent: 60 }
  pro:  { rate: 100, burst: 200 }
rules:
  - name: search-dry
    tier: pro
    scope: "api:search"
    rate: 1
    period: hour
    burst: 2
    dry_run: true
costs: { "api:search": 10, "health": 0 }
keys: { acct_pro: pro }
`

// newLimiter is a limiter backed by a real redis-server.
func newLimiter(t *testing.T) *enforcement.Limiter {
	t.Helper()
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	pol, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	l, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "http"), Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type checkResponse struct {
	Allowed      *bool   `json:"allowed"`
	Remaining    *int64  `json:"remaining"`
	Limit        *int64  `json:"limit"`
	ResetAt      *string `json:"resetAt"`
	RetryAfterMs *int64  `json:"retryAfterMs"`
	Source       *string `json:"source"`
	Policy       *string `json:"policy"`
	DryRun       *bool   `json:"dryRun"`
	WouldAllow   *bool   `json:"wouldAllow"`
	Warning      *bool   `json:"warning"`
}

type errorResponse struct {
	Error struct {
		Code, Message, RequestID string
	} `json:"error"`
}

func post(t *testing.T, h http.Handler, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/check", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestCheckResponseFields(t *testing.T) {
	h := httpapi.NewCheckHandler(newLimiter(t), "", nil)
	start := time.Now() // the bucket is full until the first request
	var last checkResponse
	for i := 0; i < 4; i++ {
		w := post(t, h, `{"key":"acct_1","scope":"api:read","cost":1}`)
		if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("status %d %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
		}
		last = checkResponse{}
		if err := json.Unmarshal(w.Body.Bytes(), &last); err != nil {
			t.Fatal(err)
		}
	}
	if last.Allowed == nil || last.Remaining == nil || last.Limit == nil || last.ResetAt == nil || last.RetryAfterMs == nil ||
		last.Source == nil || last.Policy == nil || last.DryRun == nil || last.WouldAllow == nil || last.Warning == nil {
		t.Fatalf("missing fields: %+v", last)
	}
	if !*last.Allowed || *last.Remaining != 1 || *last.Limit != 5 || *last.Source != "shared" || *last.Policy != "free" || !*last.Warning {
		t.Fatalf("4th of burst 5 with 60%% soft limit: %+v", last)
	}
	// 4 tokens to refill at one an hour: 4 h from the moment the bucket was
	// read, which is at most what the test took ago (and resetAt is rounded
	// up to the second).
	reset, err := time.Parse(time.RFC3339, *last.ResetAt)
	if until := time.Until(reset); err != nil || reset.Location() != time.UTC ||
		until > 4*time.Hour+time.Second || until < 4*time.Hour-time.Since(start)-time.Second {
		t.Fatalf("resetAt %q: want RFC 3339 UTC 4 h ahead less at most %v (%v)", *last.ResetAt, time.Since(start), err)
	}

	// Exhaust, then a rejection is still a 200 with an exact retry time.
	post(t, h, `{"key":"acct_1","scope":"api:read"}`)
	w := post(t, h, `{"key":"acct_1","scope":"api:read","cost":2}`)
	var rej checkResponse
	json.Unmarshal(w.Body.Bytes(), &rej)
	// A deficit of 2 tokens at one an hour: 2 h, less what refilled since
	// the bucket emptied (at most the time the test took); +1 ms of rounding up.
	const deficit = 2 * 3600 * 1000
	if w.Code != 200 || *rej.Allowed || *rej.RetryAfterMs > deficit+1 || *rej.RetryAfterMs < deficit-time.Since(start).Milliseconds()-1 {
		t.Fatalf("rejection: %d %s; want retryAfterMs %d less at most %v", w.Code, w.Body, deficit, time.Since(start))
	}

	// Dry run: allowed, with what enforcement would have done.
	for i := 0; i < 3; i++ {
		w = post(t, h, `{"key":"acct_pro","scope":"api:search","cost":1}`)
	}
	var dry checkResponse
	json.Unmarshal(w.Body.Bytes(), &dry)
	if !*dry.Allowed || !*dry.DryRun || *dry.WouldAllow || *dry.Policy != "search-dry" {
		t.Fatalf("dry run: %s", w.Body)
	}

	// tier given by the caller wins over the keys map.
	w = post(t, h, `{"key":"acct_pro","scope":"api:read","tier":"free"}`)
	var tiered checkResponse
	json.Unmarshal(w.Body.Bytes(), &tiered)
	if *tiered.Limit != 5 {
		t.Fatalf("tier free given: %s", w.Body)
	}
	// cost 0 scope: always allowed.
	if w := post(t, h, `{"key":"acct_1","scope":"health"}`); !strings.Contains(w.Body.String(), `"allowed":true`) {
		t.Fatalf("health (cost 0): %s", w.Body)
	}
}

func TestCheckErrors(t *testing.T) {
	h := httpapi.NewCheckHandler(newLimiter(t), "", nil)
	cases := []struct {
		name, body string
		status     int
		code, msg  string
	}{
		{"malformed", `{"key":`, 400, "invalid_request", "not a JSON object"},
		{"not an object", `[1,2]`, 400, "invalid_request", "JSON object"},
		{"missing key", `{"scope":"s"}`, 400, "invalid_request", "key is required"},
		{"empty key", `{"key":"","scope":"s"}`, 400, "invalid_request", "key is required"},
		{"oversized key", `{"key":"` + strings.Repeat("k", 257) + `","scope":"s"}`, 400, "invalid_request", "at most 256"},
		{"missing scope", `{"key":"k"}`, 400, "invalid_request", "scope is required"},
		{"oversized scope", `{"key":"k","scope":"` + strings.Repeat("s", 129) + `"}`, 400, "invalid_request", "at most 128"},
		{"key wrong type", `{"key":42,"scope":"s"}`, 400, "invalid_request", "key must be a string"},
		{"cost negative", `{"key":"k","scope":"s","cost":-1}`, 400, "invalid_request", "cost must be an integer ≥ 0"},
		{"cost fractional", `{"key":"k","scope":"s","cost":1.5}`, 400, "invalid_request", "cost must be an integer ≥ 0"},
		{"cost too large", `{"key":"k","scope":"s","cost":1000000001}`, 400, "invalid_request", "cost must be an integer ≥ 0"},
		{"cost string", `{"key":"k","scope":"s","cost":"5"}`, 400, "invalid_request", "cost must be a number"},
		{"cost exceeds capacity", `{"key":"k","scope":"s","cost":6}`, 400, "cost_exceeds_limit", "capacity 5"},
		{"unknown tier", `{"key":"k","scope":"s","tier":"gold"}`, 400, "invalid_request", "unknown tier"},
		{"too large", `{"key":"k","scope":"s","pad":"` + strings.Repeat("x", 64<<10) + `"}`, 413, "payload_too_large", "64 KiB"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := post(t, h, c.body)
			var e errorResponse
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			if w.Code != c.status || e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.msg) {
				t.Fatalf("got %d %+v, want %d %s containing %q", w.Code, e.Error, c.status, c.code, c.msg)
			}
		})
	}
	// Unknown fields are ignored; exponent integers are integers.
	if w := post(t, h, `{"key":"k2","scope":"s","extra":{"a":1},"cost":2e0}`); w.Code != 200 {
		t.Fatalf("unknown field / 2e0: %d %s", w.Code, w.Body)
	}
	// Wrong method.
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/check", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /check: %d", w.Code)
	}
}

func TestCheckAuth(t *testing.T) {
	h := httpapi.NewCheckHandler(newLimiter(t), "s3cret", nil)
	body := `{"key":"k","scope":"s"}`
	for _, hdr := range []string{"", "Bearer wrong", "Basic s3cret", "Bearer s3cret2"} {
		if w := post(t, h, body, "Authorization", hdr); w.Code != 401 || !strings.Contains(w.Body.String(), `"unauthorized"`) {
			t.Fatalf("Authorization %q: %d %s", hdr, w.Code, w.Body)
		}
	}
	if w := post(t, h, body, "Authorization", "Bearer s3cret"); w.Code != 200 {
		t.Fatalf("right token: %d %s", w.Code, w.Body)
	}
}

func TestMiddlewareHeaders(t *testing.T) {
	lim := newLimiter(t)
	proxies, err := httpapi.NewProxies("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	g := &httpapi.Guard{Checker: lim, Key: httpapi.FirstKey(httpapi.HeaderKey("X-API-Key", "key:"), httpapi.AddressKey(proxies))}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := httptest.NewServer(httpapi.Middleware(g)(mux))
	defer srv.Close()

	get := func(hdr ...string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/items", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	var resp *http.Response
	start := time.Now() // the bucket is full until the first request
	for i := 0; i < 5; i++ {
		resp = get("X-API-Key", "abc")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if resp.Header.Get("RateLimit-Limit") != "5" || resp.Header.Get("RateLimit-Remaining") != strconv.Itoa(4-i) || resp.Header.Get("RateLimit-Reset") == "" {
			t.Fatalf("headers on 200 #%d: %v", i, resp.Header)
		}
	}
	resp = get("X-API-Key", "abc", "X-Request-Id", "req_test_1")
	body, _ := io.ReadAll(resp.Body)
	var e errorResponse
	json.Unmarshal(body, &e)
	// One token at one an hour: 3600 s, less the whole seconds that refilled
	// since the bucket emptied (at most the time the test took).
	retry, _ := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	if resp.StatusCode != 429 || retry > 3600 || retry < 3600-int64(time.Since(start).Seconds())-1 || resp.Header.Get("RateLimit-Remaining") != "0" ||
		e.Error.Code != "rate_limited" || e.Error.RequestID != "req_test_1" ||
		!strings.Contains(e.Error.Message, fmt.Sprintf("Retry in about %d seconds.", retry)) {
		t.Fatalf("429: %d %v %s", resp.StatusCode, resp.Header, body)
	}

	// Without an identity, the address keys the request. httptest's client
	// connects from 127.0.0.1, which is not a trusted proxy here: a spoofed
	// X-Forwarded-For must not mint a fresh bucket per request.
	for i := 0; i < 5; i++ {
		get("X-Forwarded-For", "203.0.113."+strconv.Itoa(i))
	}
	if resp := get("X-Forwarded-For", "203.0.113.99"); resp.StatusCode != 429 {
		t.Fatalf("spoofed X-Forwarded-For from an untrusted peer got a fresh bucket: %d", resp.StatusCode)
	}
}

func TestClientAddr(t *testing.T) {
	p, err := httpapi.NewProxies("10.0.0.0/8", "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, peer string
		hdr        map[string]string
		want       string
	}{
		{"direct, no headers", "198.51.100.7:5000", nil, "198.51.100.7"},
		{"untrusted peer, spoofed XFF ignored", "198.51.100.7:5000", map[string]string{"X-Forwarded-For": "203.0.113.1"}, "198.51.100.7"},
		{"trusted peer, XFF used", "10.1.2.3:443", map[string]string{"X-Forwarded-For": "203.0.113.1"}, "203.0.113.1"},
		{"trusted chain, client prepends a spoof", "10.1.2.3:443", map[string]string{"X-Forwarded-For": "1.1.1.1, 203.0.113.1, 10.9.9.9"}, "203.0.113.1"},
		{"Forwarded header", "192.0.2.1:80", map[string]string{"Forwarded": `for="[2001:db8::7]:4711";proto=https`}, "2001:db8::7"},
		{"garbage hop stops the walk", "10.1.2.3:443", map[string]string{"X-Forwarded-For": "not-an-ip"}, "10.1.2.3"},
		{"all hops trusted", "10.1.2.3:443", map[string]string{"X-Forwarded-For": "10.0.0.5"}, "10.0.0.5"},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.peer
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		if got := p.ClientAddr(r).String(); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
	if _, err := httpapi.NewProxies("10.0.0.0/33"); err == nil {
		t.Error("a bad CIDR was accepted")
	}
}
