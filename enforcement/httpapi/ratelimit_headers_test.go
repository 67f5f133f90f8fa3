package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// sfItem is one member of a RateLimit or RateLimit-Policy field, parsed by
// an independent RFC 9651 implementation.
type sfItem struct {
	name   string
	params map[string]int64
}

func parseField(t *testing.T, v string) []sfItem {
	t.Helper()
	l, err := httpsfv.UnmarshalList([]string{v})
	if err != nil || len(l) == 0 {
		t.Fatalf("%q is not a non-empty RFC 9651 List: %v", v, err)
	}
	var out []sfItem
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		name, isString := it.Value.(string)
		if !ok || !isString {
			t.Fatalf("%q: member %v is not an Item with a String", v, m)
		}
		p := map[string]int64{}
		for _, k := range it.Params.Names() {
			pv, _ := it.Params.Get(k)
			n, ok := pv.(int64)
			if !ok {
				t.Fatalf("%q: parameter %s=%v is not an Integer", v, k, pv)
			}
			p[k] = n
		}
		out = append(out, sfItem{name, p})
	}
	return out
}

// quotaPolicy: tier q has a bucket that refills one token an hour (no whole
// token comes back while the test runs) and a daily quota of 3, so the
// quota binds first.
const quotaPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 5 }
  q:    { rate: 1, period: hour, burst: 5, quota: { limit: 3, period: day } }
keys: { acct_q: q }
`

func redisLimiter(t *testing.T, pol string) *enforcement.Limiter {
	t.Helper()
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	p, err := policy.Parse([]byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	l, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "hdr"), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func guardGet(t *testing.T, h http.Handler, key string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/items", nil)
	r.Header.Set("X-API-Key", key)
	r.Header.Set("X-Request-Id", "req_hdr")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareDraftFields(t *testing.T) {
	lim := redisLimiter(t, quotaPolicy)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	h := httpapi.Middleware(&httpapi.Guard{Checker: lim, Key: httpapi.HeaderKey("X-API-Key", "")})(ok)

	// Bucket only: burst 5 refilled in 5 h, so w = 18000 and t ≤ w.
	for i := 0; i < 5; i++ {
		w := guardGet(t, h, "acct_free")
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
		// ResponseRecorder's map is read as is: the fields must be under
		// their canonical keys for Header().Get to find them.
		if got := w.Header().Get("RateLimit-Policy"); got != `"free";q=5;w=18000` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		rl := parseField(t, w.Header().Get("RateLimit"))
		if len(rl) != 1 || rl[0].name != "free" || rl[0].params["r"] != int64(4-i) ||
			rl[0].params["t"] < 0 || rl[0].params["t"] > 18000 || (i > 0 && rl[0].params["t"] < 3000) {
			t.Fatalf("request %d: RateLimit %q", i, w.Header().Get("RateLimit"))
		}
		if w.Header().Get("RateLimit-Limit") != "5" || w.Header().Get("RateLimit-Remaining") != strconv.Itoa(4-i) {
			t.Fatalf("legacy trio missing in mode both: %v", w.Header())
		}
	}
	w := guardGet(t, h, "acct_free")
	rl := parseField(t, w.Header().Get("RateLimit"))
	retry, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	if w.Code != 429 || retry < 3500 || rl[0].params["r"] != 0 || rl[0].params["t"] != retry {
		t.Fatalf("429: t must equal Retry-After: %d %v", w.Code, w.Header())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var prob struct {
		Type     string   `json:"type"`
		Title    string   `json:"title"`
		Status   int      `json:"status"`
		Detail   string   `json:"detail"`
		Violated []string `json:"violated-policies"`
		Error    struct{ Code, Message, RequestID string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &prob); err != nil {
		t.Fatal(err)
	}
	if prob.Type != httpapi.QuotaExceededType || prob.Title != "Quota Exceeded" || prob.Status != 429 || prob.Detail == "" ||
		len(prob.Violated) != 1 || prob.Violated[0] != "free" ||
		prob.Error.Code != "rate_limited" || prob.Error.Message != prob.Detail || prob.Error.RequestID != "req_hdr" {
		t.Fatalf("problem body %s", w.Body)
	}

	// A daily quota of 3: a second item in both fields, t = seconds to the
	// end of the UTC day, w = the day's length; the quota refuses the 4th.
	// t is checked to a minute: the time between the decision and the check
	// is the machine's, not the code's.
	for i := 0; i < 3; i++ {
		w := guardGet(t, h, "acct_q")
		pol := parseField(t, w.Header().Get("RateLimit-Policy"))
		rl := parseField(t, w.Header().Get("RateLimit"))
		_, end := enforcement.PeriodDay.Window(time.Now())
		if w.Code != 200 || len(pol) != 2 || pol[1].name != "q-quota" || pol[1].params["q"] != 3 || pol[1].params["w"] != 86400 ||
			len(rl) != 2 || rl[1].name != "q-quota" || rl[1].params["r"] != int64(2-i) ||
			rl[1].params["t"] > int64(time.Until(end)/time.Second)+1 || rl[1].params["t"] < int64(time.Until(end)/time.Second)-60 {
			t.Fatalf("quota request %d: %d %v", i, w.Code, w.Header())
		}
		if rl[0].params["r"] != int64(4-i) {
			t.Fatalf("quota request %d: the bucket item must keep its own r: %v", i, w.Header())
		}
	}
	w = guardGet(t, h, "acct_q")
	rl = parseField(t, w.Header().Get("RateLimit"))
	retry, _ = strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	if w.Code != 429 || rl[1].params["r"] != 0 || rl[1].params["t"] != retry || rl[0].params["r"] != 2 {
		t.Fatalf("quota 429: %d %v", w.Code, w.Header())
	}
	json.Unmarshal(w.Body.Bytes(), &prob)
	if len(prob.Violated) != 1 || prob.Violated[0] != "q-quota" {
		t.Fatalf("violated-policies %v", prob.Violated)
	}
}

func TestMiddlewareHeaderModes(t *testing.T) {
	lim := redisLimiter(t, quotaPolicy)
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, tc := range []struct {
		mode          ratelimitheader.Mode
		legacy, draft bool
		problem       bool
	}{
		{ratelimitheader.Legacy, true, false, false},
		{ratelimitheader.Draft, false, true, true},
		{ratelimitheader.None, false, false, true},
	} {
		h := httpapi.Middleware(&httpapi.Guard{Checker: lim, Key: httpapi.HeaderKey("X-API-Key", ""), Headers: tc.mode})(ok)
		key := "acct_" + tc.mode.String()
		for i := 0; i < 5; i++ {
			guardGet(t, h, key)
		}
		w := guardGet(t, h, key)
		hd := w.Header()
		if w.Code != 429 || (hd.Get("RateLimit-Limit") != "") != tc.legacy || (hd.Get("RateLimit-Policy") != "") != tc.draft ||
			(hd.Get("RateLimit") != "") != tc.draft || hd.Get("Retry-After") == "" {
			t.Fatalf("mode %v: %d %v", tc.mode, w.Code, hd)
		}
		if ct := hd.Get("Content-Type"); (ct == "application/problem+json") != tc.problem {
			t.Fatalf("mode %v: Content-Type %q", tc.mode, ct)
		}
		var e errorResponse
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code != "rate_limited" {
			t.Fatalf("mode %v: the error object is kept for every mode: %s", tc.mode, w.Body)
		}
	}
}

type checkHeaders struct {
	Allowed bool              `json:"allowed"`
	Headers map[string]string `json:"headers"`
}

func TestCheckHeadersObject(t *testing.T) {
	lim := redisLimiter(t, quotaPolicy)
	h := httpapi.NewCheckHandler(lim, "", nil)
	var last checkHeaders
	for i := 0; i < 6; i++ {
		w := post(t, h, `{"key":"acct_q","scope":"api:read"}`)
		last = checkHeaders{}
		if err := json.Unmarshal(w.Body.Bytes(), &last); err != nil {
			t.Fatalf("%v: %s", err, w.Body)
		}
		hd := last.Headers
		pol, rl := parseField(t, hd["RateLimit-Policy"]), parseField(t, hd["RateLimit"])
		if len(pol) != 2 || pol[0].name != "q" || pol[1].name != "q-quota" || len(rl) != 2 ||
			hd["RateLimit-Limit"] == "" || hd["RateLimit-Remaining"] == "" || hd["RateLimit-Reset"] == "" {
			t.Fatalf("answer %d: headers %v", i, hd)
		}
		if _, has := hd["Retry-After"]; has == last.Allowed {
			t.Fatalf("answer %d (allowed %v): Retry-After only when rejected: %v", i, last.Allowed, hd)
		}
	}
	// Rejected by the quota (which spends no bucket token): the quota's
	// item refused and carries t = Retry-After, the bucket keeps its 2.
	rl := parseField(t, last.Headers["RateLimit"])
	if last.Allowed || rl[0].name != "q" || rl[0].params["r"] != 2 || rl[1].params["r"] != 0 ||
		rl[1].params["t"] != mustInt(t, last.Headers["Retry-After"]) {
		t.Fatalf("rejected by the quota: %v", last.Headers)
	}

	h.SetHeaderMode(ratelimitheader.Draft)
	w := post(t, h, `{"key":"acct_d","scope":"api:read"}`)
	var d checkHeaders
	json.Unmarshal(w.Body.Bytes(), &d)
	if len(d.Headers) != 2 || d.Headers["RateLimit-Policy"] != `"free";q=5;w=18000` {
		t.Fatalf("draft: %s", w.Body)
	}
	h.SetHeaderMode(ratelimitheader.None)
	w = post(t, h, `{"key":"acct_d","scope":"api:read"}`)
	var raw map[string]json.RawMessage
	json.Unmarshal(w.Body.Bytes(), &raw)
	if _, has := raw["headers"]; has {
		t.Fatalf("none: %s", w.Body)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The /check answer and the middleware write one decision the same way.
func TestCheckHeadersMatchMiddleware(t *testing.T) {
	lim := redisLimiter(t, quotaPolicy)
	h := httpapi.NewCheckHandler(lim, "", nil)
	g := httpapi.Middleware(&httpapi.Guard{Checker: lim, Key: httpapi.HeaderKey("X-API-Key", ""),
		Scope: func(*http.Request) string { return "api:read" }})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := 0; i < 6; i++ {
		key := "acct_m" + strconv.Itoa(i)
		for j := 0; j < i; j++ {
			post(t, h, `{"key":"`+key+`","scope":"api:read"}`)
		}
		w := post(t, h, `{"key":"`+key+`","scope":"api:read"}`)
		var c checkHeaders
		json.Unmarshal(w.Body.Bytes(), &c)
		// the same state again for the middleware: a fresh key spent alike
		mk := key + "-mw"
		for j := 0; j < i; j++ {
			guardGet(t, g, mk)
		}
		mw := guardGet(t, g, mk).Header()
		for _, f := range []string{"RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining"} {
			if c.Headers[f] != mw.Get(f) {
				t.Fatalf("step %d %s: /check %q, middleware %q", i, f, c.Headers[f], mw.Get(f))
			}
		}
		// The two keys emptied at moments the machine chose: their waits
		// agree to the second they were rounded to.
		if (c.Headers["Retry-After"] == "") != (mw.Get("Retry-After") == "") ||
			c.Headers["Retry-After"] != "" && abs(mustInt(t, c.Headers["Retry-After"])-mustInt(t, mw.Get("Retry-After"))) > 60 {
			t.Fatalf("step %d Retry-After: /check %q, middleware %q", i, c.Headers["Retry-After"], mw.Get("Retry-After"))
		}
		if parseField(t, c.Headers["RateLimit"])[0].params["r"] != parseField(t, mw.Get("RateLimit"))[0].params["r"] {
			t.Fatalf("step %d RateLimit: /check %q, middleware %q", i, c.Headers["RateLimit"], mw.Get("RateLimit"))
		}
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
