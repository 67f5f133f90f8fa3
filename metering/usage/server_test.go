package usage

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var testNow = time.Date(2026, 7, 31, 9, 15, 30, 0, time.UTC)

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

type tokenResp struct {
	ID, Token, ExpiresAt string
}

func (e *env) issue(key string, ttl int) tokenResp {
	e.t.Helper()
	code, b := e.do("POST", "/v1/admin/portal-tokens", testAdmin, fmt.Sprintf(`{"key": %q, "ttl_seconds": %d}`, key, ttl))
	if code != 201 {
		e.t.Fatalf("issue token: %d %s", code, b)
	}
	return decode[tokenResp](e.t, b)
}

func errCode(t *testing.T, b []byte) string {
	t.Helper()
	var v struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Error.Code == "" || v.Error.Message == "" {
		t.Fatalf("not an error body: %s", b)
	}
	return v.Error.Code
}

func TestWhoSeesWhat(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	seed(t, e.conn, e.db, []decision{
		{ts: testNow.Add(-time.Hour), key: "acct_a", scope: "api:search", tier: "enterprise", cost: 10, allowed: true},
		{ts: testNow.Add(-time.Hour), key: "acct_b", scope: "api:search", tier: "pro", cost: 10, allowed: true},
	})
	a := e.issue("acct_a", 3600)

	code, b := e.do("GET", "/v1/usage", a.Token, "")
	if code != 200 {
		t.Fatalf("own usage: %d %s", code, b)
	}
	if u := decode[usageResponse](t, b); u.Key != "acct_a" || u.Totals.Requests != 1 {
		t.Fatalf("own usage: %+v", u)
	}
	if code, b := e.do("GET", "/v1/usage?key=acct_a", a.Token, ""); code != 200 {
		t.Fatalf("own usage with key=: %d %s", code, b)
	}
	for _, path := range []string{"/v1/usage?key=acct_b", "/v1/quota?key=acct_b"} {
		if code, b := e.do("GET", path, a.Token, ""); code != 403 || errCode(t, b) != "forbidden" {
			t.Errorf("%s with acct_a's token: %d %s", path, code, b)
		}
	}

	other, _ := NewSigner([]byte("a-different-secret-0123456789"))
	foreign, _ := other.Sign(Claims{ID: "pt_00000000000000000000000000000000", Key: "acct_b", Expires: testNow.Add(time.Hour).Unix()})
	expired, _ := e.signer.Sign(Claims{ID: "pt_00000000000000000000000000000001", Key: "acct_a", Expires: testNow.Add(-time.Second).Unix()})
	dot := strings.LastIndexByte(a.Token, '.')
	mine, _ := e.signer.Sign(Claims{ID: a.ID, Key: "acct_b", Expires: testNow.Add(time.Hour).Unix()})
	tampered := mine[:strings.LastIndexByte(mine, '.')] + a.Token[dot:] // acct_b claims, acct_a signature
	for name, tok := range map[string]string{
		"missing": "", "garbage": "hello", "foreign secret": foreign, "expired": expired, "tampered claims": tampered,
		"truncated": a.Token[:len(a.Token)-1], "admin token with suffix": testAdmin + "x",
	} {
		for _, path := range []string{"/v1/usage", "/v1/quota"} {
			if code, b := e.do("GET", path, tok, ""); code != 401 || errCode(t, b) != "unauthorized" {
				t.Errorf("%s token on %s: %d %s", name, path, code, b)
			}
		}
	}

	// Every admin endpoint refuses no token, a portal token and a wrong token.
	for _, r := range [][2]string{{"POST", "/v1/admin/portal-tokens"}, {"DELETE", "/v1/admin/portal-tokens/" + a.ID},
		{"GET", "/v1/admin/top-keys"}, {"GET", "/v1/admin/webhook-deliveries"}} {
		for _, tok := range []string{"", a.Token, "wrong"} {
			if code, b := e.do(r[0], r[1], tok, `{"key":"acct_b"}`); code != 401 {
				t.Errorf("%s %s with %q: %d %s", r[0], r[1], tok, code, b)
			}
		}
	}
	// The admin reads any key, but must name it.
	if code, b := e.do("GET", "/v1/usage?key=acct_b", testAdmin, ""); code != 200 || decode[usageResponse](t, b).Key != "acct_b" {
		t.Fatalf("admin usage: %d %s", code, b)
	}
	if code, b := e.do("GET", "/v1/usage", testAdmin, ""); code != 400 {
		t.Fatalf("admin usage without key: %d %s", code, b)
	}

	// Revocation: refused at once, and still after a restart (a new server
	// and store over the same database).
	if code, b := e.do("DELETE", "/v1/admin/portal-tokens/"+a.ID, testAdmin, ""); code != 204 {
		t.Fatalf("revoke: %d %s", code, b)
	}
	if code, b := e.do("GET", "/v1/usage", a.Token, ""); code != 401 || !strings.Contains(string(b), "revoked") {
		t.Fatalf("revoked token: %d %s", code, b)
	}
	store2, _ := NewStore(sharedCH.Conn(t), e.db)
	e.store = store2
	restarted := e.newServer()
	code, b = doHTTPHandler(t, restarted, "GET", "/v1/usage", a.Token)
	if code != 401 || !strings.Contains(string(b), "revoked") {
		t.Fatalf("revoked token after restart: %d %s", code, b)
	}
	if code, b := e.do("DELETE", "/v1/admin/portal-tokens/pt_ffffffffffffffffffffffffffffffff", testAdmin, ""); code != 404 {
		t.Fatalf("revoke unknown: %d %s", code, b)
	}
	if code, b := e.do("DELETE", "/v1/admin/portal-tokens/x'%20OR%20'1'='1", testAdmin, ""); code != 400 {
		t.Fatalf("revoke bad id: %d %s", code, b)
	}
	// Another token of the same key still works.
	if code, b := e.do("GET", "/v1/usage", e.issue("acct_a", 60).Token, ""); code != 200 {
		t.Fatalf("second token: %d %s", code, b)
	}
	if code, b := e.do("POST", "/v1/admin/portal-tokens", testAdmin, `{"key":"`+strings.Repeat("k", 70000)+`"}`); code != 413 {
		t.Errorf("70 kB body: %d %s", code, b)
	}
	for _, body := range []string{`{"key":""}`, `{"key":"a","ttl_seconds":0}`, `{"key":"a","ttl_seconds":99999999999}`, `{"key":"a","extra":1}`, `not json`} {
		if code, b := e.do("POST", "/v1/admin/portal-tokens", testAdmin, body); code != 400 {
			t.Errorf("issue %s: %d %s", body, code, b)
		}
	}
}

// TestInjectionPerParameter sends SQL-shaped values in every parameter: each
// is refused with 400 or read as an opaque value that matches nothing, and
// the data is intact afterwards.
func TestInjectionPerParameter(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	seed(t, e.conn, e.db, []decision{
		{ts: testNow.Add(-time.Hour), key: "acct_a", scope: "api:search", tier: "pro", cost: 1, allowed: true},
		{ts: testNow.Add(-time.Hour), key: "acct_b", scope: "api:other", tier: "pro", cost: 1, allowed: true},
	})
	payloads := []string{`' OR '1'='1`, `acct_a' --`, `\' OR 1=1 --`, `'); DROP TABLE ` + e.db + `.usage_hour; --`, `? OR ?`, "x\u2019 OR 1=1", `acct_a%`, `*`}
	base := url.Values{"key": {"acct_a"}, "window": {"hour"}}
	type check func(t *testing.T, code int, body []byte) string
	emptyOr400 := func(t *testing.T, code int, b []byte) string {
		if code == 400 {
			return ""
		}
		if code != 200 {
			return fmt.Sprintf("status %d", code)
		}
		if u := decode[usageResponse](t, b); u.Totals.Requests != 0 {
			return fmt.Sprintf("matched data: %+v", u.Totals)
		}
		return ""
	}
	only400 := func(_ *testing.T, code int, _ []byte) string {
		if code != 400 {
			return fmt.Sprintf("status %d, want 400", code)
		}
		return ""
	}
	for param, c := range map[string]check{"key": emptyOr400, "scope": emptyOr400, "window": only400, "group_by": only400, "tz": only400, "from": only400, "to": only400} {
		t.Run("usage/"+param, func(t *testing.T) {
			for _, p := range payloads {
				q := url.Values{}
				for k, v := range base {
					q[k] = v
				}
				q.Set(param, p)
				code, b := doHTTP(t, e.http.URL, "GET", "/v1/usage?"+q.Encode(), testAdmin, "")
				if msg := c(t, code, b); msg != "" {
					t.Errorf("usage %s=%q: %s: %s", param, p, msg, b)
				}
			}
		})
	}
	for _, p := range payloads {
		for _, param := range []string{"from", "to", "limit"} {
			if code, b := e.do("GET", "/v1/admin/top-keys?"+url.Values{param: {p}}.Encode(), testAdmin, ""); code != 400 {
				t.Errorf("top-keys %s=%q: %d %s", param, p, code, b)
			}
		}
		for _, param := range []string{"key", "delivery_id"} {
			code, b := e.do("GET", "/v1/admin/webhook-deliveries?"+url.Values{param: {p}}.Encode(), testAdmin, "")
			if code != 400 && (code != 200 || !strings.Contains(string(b), `"attempts":[]`)) {
				t.Errorf("webhook-deliveries %s=%q: %d %s", param, p, code, b)
			}
		}
		code, b := e.do("GET", "/v1/quota?"+url.Values{"key": {p}}.Encode(), testAdmin, "")
		if code != 400 && (code != 200 || decode[quotaResponse](t, b).SoftLimit.WarningsLastHour != 0) {
			t.Errorf("quota key=%q: %d %s", p, code, b)
		}
		if code, b := e.do("POST", "/v1/admin/portal-tokens", testAdmin, fmt.Sprintf(`{"key": %q}`, p)); code != 201 {
			t.Errorf("issue key=%q: %d %s (an opaque key is fine)", p, code, b)
		}
	}
	// The data is intact: both keys, unchanged.
	code, b := e.do("GET", "/v1/admin/top-keys?limit=10", testAdmin, "")
	if code != 200 || !strings.Contains(string(b), `"key":"acct_a"`) || !strings.Contains(string(b), `"key":"acct_b"`) {
		t.Fatalf("top keys after injections: %d %s", code, b)
	}
}

// TestUsageEqualsSeeded: the API's numbers equal the seeded decisions, for
// every window, grouped and not, in UTC, a DST zone and a half-hour zone.
func TestUsageEqualsSeeded(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	rng := rand.New(rand.NewPCG(1, 2))
	scopes := []string{"api:search", "api:write", "health"}
	var ds []decision
	for i := 0; i < 5000; i++ {
		ds = append(ds, decision{
			ts:    testNow.Add(-time.Duration(rng.Int64N(int64(29 * 24 * time.Hour)))),
			key:   []string{"acct_a", "acct_b"}[rng.IntN(2)],
			scope: scopes[rng.IntN(len(scopes))], tier: "pro", cost: uint64(rng.IntN(20)),
			allowed: rng.IntN(4) != 0, warning: rng.IntN(10) == 0,
		})
	}
	// Minute-level detail in the last two hours.
	for i := 0; i < 2000; i++ {
		ds = append(ds, decision{ts: testNow.Add(-time.Duration(rng.Int64N(int64(2 * time.Hour)))), key: "acct_a",
			scope: scopes[rng.IntN(len(scopes))], tier: "pro", cost: 3, allowed: rng.IntN(3) != 0})
	}
	seed(t, e.conn, e.db, ds[:3000]) // two inserts: rows of one bucket in two parts
	seed(t, e.conn, e.db, ds[3000:])
	tok := e.issue("acct_a", 3600).Token

	for _, tc := range []struct{ window, tz, from, to string }{
		{"minute", "UTC", "2026-07-31T07:30:00Z", "2026-07-31T09:20:00Z"},
		{"hour", "UTC", "2026-07-02T00:00:00Z", "2026-07-31T10:00:00Z"},
		{"day", "UTC", "2026-07-01T00:00:00Z", "2026-08-01T00:00:00Z"},
		{"day", "Europe/Paris", "2026-07-01T00:00:00Z", "2026-08-01T00:00:00Z"},
		{"hour", "Asia/Kolkata", "2026-07-29T00:00:00Z", "2026-07-31T10:00:00Z"},
		{"day", "Asia/Kolkata", "2026-07-01T00:00:00Z", "2026-08-01T00:00:00Z"},
		{"hour", "America/St_Johns", "2026-07-29T00:00:00Z", "2026-07-31T10:00:00Z"},
	} {
		for _, grouped := range []bool{false, true} {
			q := url.Values{"window": {tc.window}, "tz": {tc.tz}, "from": {tc.from}, "to": {tc.to}}
			if grouped {
				q.Set("group_by", "scope")
			}
			code, b := e.do("GET", "/v1/usage?"+q.Encode(), tok, "")
			if code != 200 {
				t.Fatalf("%v: %d %s", q, code, b)
			}
			u := decode[usageResponse](t, b)
			loc, _ := time.LoadLocation(tc.tz)
			from, _ := time.Parse(time.RFC3339, u.From)
			to, _ := time.Parse(time.RFC3339, u.To)
			want := map[string]Counts{}
			var wantTotal Counts
			for _, d := range ds {
				if d.key != "acct_a" || d.ts.Before(from) || !d.ts.Before(to) {
					continue
				}
				k := bucketFloor(d.ts, Window(tc.window), loc).In(loc).Format(time.RFC3339)
				if grouped {
					k += " " + d.scope
				}
				c := Counts{Requests: 1}
				if d.allowed {
					c.Allowed, c.Cost = 1, d.cost
				} else {
					c.Rejected = 1
				}
				if d.warning {
					c.Warnings = 1
				}
				w := want[k]
				w.add(c)
				want[k] = w
				wantTotal.add(c)
			}
			got := map[string]Counts{}
			for _, p := range u.Series {
				k := p.Start
				if grouped {
					k += " " + p.Scope
				} else if p.Scope != AllScopes {
					t.Fatalf("ungrouped scope %q", p.Scope)
				}
				got[k] = Counts{p.Requests, p.Allowed, p.Rejected, p.Cost, p.Warnings}
			}
			if len(got) != len(want) || u.Totals != wantTotal || wantTotal.Requests == 0 {
				t.Fatalf("%v (%s): %d buckets, totals %+v; want %d buckets, %+v", q, u.Source, len(got), u.Totals, len(want), wantTotal)
			}
			for k, w := range want {
				if got[k] != w {
					t.Fatalf("%v (%s): bucket %s = %+v, want %+v", q, u.Source, k, got[k], w)
				}
			}
		}
	}

	// Scope filter.
	code, b := e.do("GET", "/v1/usage?window=day&from=2026-07-01T00:00:00Z&to=2026-08-01T00:00:00Z&scope=health", tok, "")
	var want uint64
	for _, d := range ds {
		if d.key == "acct_a" && d.scope == "health" {
			want++
		}
	}
	if u := decode[usageResponse](t, b); code != 200 || u.Totals.Requests != want || u.Series[0].Scope != "health" {
		t.Fatalf("scope filter: %d %+v, want %d", code, u.Totals, want)
	}

	// Top keys equal the seeded counts per key.
	code, b = e.do("GET", "/v1/admin/top-keys?from=2026-07-01T00:00:00Z&to=2026-08-01T00:00:00Z", testAdmin, "")
	tk := decode[struct{ Keys []KeyUsage }](t, b)
	per := map[string]uint64{}
	for _, d := range ds {
		per[d.key]++
	}
	if code != 200 || len(tk.Keys) != 2 || tk.Keys[0].Requests < tk.Keys[1].Requests || tk.Keys[0].Requests != per[tk.Keys[0].Key] || tk.Keys[1].Requests != per[tk.Keys[1].Key] {
		t.Fatalf("top keys: %d %s, want %v", code, b, per)
	}
}

func TestUsageLimits(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	// Two scopes × 48 h of minutes = 5,760 points > MaxPoints when grouped.
	var ds []decision
	start := testNow.Add(-48 * time.Hour).Truncate(time.Minute)
	for m := 0; m < 48*60; m++ {
		for _, s := range []string{"a", "b"} {
			ds = append(ds, decision{ts: start.Add(time.Duration(m) * time.Minute), key: "k", scope: s, tier: "free", allowed: true})
		}
	}
	seed(t, e.conn, e.db, ds)
	q := "/v1/usage?key=k&window=minute&from=" + start.Format(time.RFC3339) + "&to=" + start.Add(48*time.Hour).Format(time.RFC3339)
	if code, b := e.do("GET", q+"&group_by=scope", testAdmin, ""); code != 400 || errCode(t, b) != "too_many_points" {
		t.Fatalf("too many points: %d %s", code, b)
	}
	code, b := e.do("GET", q, testAdmin, "")
	if u := decode[usageResponse](t, b); code != 200 || len(u.Series) != 48*60 || u.Totals.Requests != uint64(len(ds)) {
		t.Fatalf("ungrouped: %d %d points %+v", code, len(u.Series), u.Totals)
	}
	for _, bad := range []string{"from=2026-07-31T00:00:00Z&to=2026-07-30T00:00:00Z", "window=minute&from=2026-07-01T00:00:00Z&to=2026-07-31T00:00:00Z"} {
		if code, b := e.do("GET", "/v1/usage?key=k&"+bad, testAdmin, ""); code != 400 || errCode(t, b) != "invalid_request" {
			t.Errorf("%s: %d %s", bad, code, b)
		}
	}
}

func TestQuota(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	seed(t, e.conn, e.db, []decision{
		{ts: time.Date(2026, 6, 30, 23, 0, 0, 0, time.UTC), key: "acct_a", scope: "s", tier: "enterprise", cost: 500, allowed: true}, // last month
		{ts: time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC), key: "acct_a", scope: "s", tier: "enterprise", cost: 400, allowed: true},
		{ts: time.Date(2026, 7, 20, 5, 0, 0, 0, time.UTC), key: "acct_a", scope: "t", tier: "enterprise", cost: 450, allowed: true},
		{ts: time.Date(2026, 7, 20, 5, 0, 0, 0, time.UTC), key: "acct_a", scope: "t", tier: "enterprise", cost: 99, allowed: false},
		{ts: testNow.Add(-10 * time.Minute), key: "acct_b", scope: "t", tier: "pro", cost: 1, allowed: true, warning: true},
	})
	code, b := e.do("GET", "/v1/quota", e.issue("acct_a", 60).Token, "")
	q := decode[quotaResponse](t, b)
	if code != 200 || q.Quota == nil || q.Tier != "enterprise" || q.Quota.Used != 850 || q.Quota.Remaining != 150 || q.Quota.Limit != 1000 ||
		q.Quota.ResetsAt != "2026-08-01T00:00:00Z" || q.Quota.PeriodStart != "2026-07-01T00:00:00Z" || q.SoftLimit.State != "warning" {
		t.Fatalf("quota acct_a: %d %s", code, b)
	}
	code, b = e.do("GET", "/v1/quota?key=acct_b", testAdmin, "")
	q = decode[quotaResponse](t, b)
	if code != 200 || q.Quota != nil || q.Tier != "pro" || q.SoftLimit.State != "warning" || q.SoftLimit.WarningsLastHour != 1 {
		t.Fatalf("quota acct_b: %d %s", code, b)
	}
	code, b = e.do("GET", "/v1/quota?key=someone", testAdmin, "")
	if q = decode[quotaResponse](t, b); code != 200 || q.Quota != nil || q.Tier != "free" || q.SoftLimit.State != "none" {
		t.Fatalf("quota free: %d %s", code, b)
	}
}

// TestClickHouseOutage: 503 with a clear error while ClickHouse is down, and
// recovery without a restart of the API.
func TestClickHouseOutage(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	e := newEnv(t, ch, testNow)
	tok := e.issue("acct_a", 3600).Token
	if code, b := e.do("GET", "/readyz", "", ""); code != 200 {
		t.Fatalf("readyz: %d %s", code, b)
	}
	ch.Stop()
	for _, path := range []string{"/v1/usage", "/v1/quota"} {
		code, b := e.do("GET", path, tok, "")
		if code != 503 || errCode(t, b) != "store_unavailable" || !strings.Contains(string(b), "ClickHouse") {
			t.Fatalf("%s while down: %d %s", path, code, b)
		}
	}
	if code, b := e.do("GET", "/v1/admin/top-keys", testAdmin, ""); code != 503 {
		t.Fatalf("top-keys while down: %d %s", code, b)
	}
	if code, b := e.do("GET", "/readyz", "", ""); code != 503 || !strings.Contains(string(b), `"reason"`) {
		t.Fatalf("readyz while down: %d %s", code, b)
	}
	if code, _ := e.do("GET", "/healthz", "", ""); code != 200 {
		t.Fatalf("healthz while down: %d", code)
	}
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	// Generous: the loop ends as soon as a query succeeds.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		code, b := e.do("GET", "/v1/usage", tok, "")
		if code == 200 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no recovery after restart: %d %s", code, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, b := e.do("GET", "/readyz", "", ""); code != 200 {
		t.Fatalf("readyz after recovery: %d %s", code, b)
	}
}

func TestDashboardAndOperability(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	// In order, /metrics last: the request counter appears once a request
	// has been counted (a map's random order fetched it first at times).
	for _, c := range []struct{ path, want string }{
		{"/", "Portal token"},
		{"/assets/app.js", "Authorization"},
		{"/assets/vendor/uPlot.iife.min.js", "uPlot"},
		{"/assets/vendor/uPlot.LICENSE", "MIT License"},
		{"/healthz", "ok"},
		{"/metrics", "usage_api_requests_total"},
	} {
		if code, b := e.do("GET", c.path, "", ""); code != 200 || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %d, missing %q", c.path, code, c.want)
		}
	}
	if code, _ := e.do("GET", "/nope", "", ""); code != 404 {
		t.Errorf("/nope: %d", code)
	}
}
