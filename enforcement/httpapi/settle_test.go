package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const tokenPolicy = `
version: 1
default_tier: llm
tiers:
  llm: { rate: 1, period: hour, burst: 1000 }
`

// reserveLimiter is a limiter keeping reservations in a real redis-server.
func reserveLimiter(t *testing.T) *enforcement.Limiter {
	t.Helper()
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	pol, err := policy.Parse([]byte(tokenPolicy))
	if err != nil {
		t.Fatal(err)
	}
	st := redisstore.New(rdb, "http")
	l, err := enforcement.New(enforcement.Config{Authority: st, Reservations: st, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type settleResponse struct {
	Settled   *bool  `json:"settled"`
	Charged   *int64 `json:"charged"`
	Refunded  *int64 `json:"refunded"`
	Remaining *int64 `json:"remaining"`
	Debt      *int64 `json:"debt"`
	Estimate  *int64 `json:"estimate"`
	Queued    bool   `json:"queued"`
}

func decodeInto(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
}

func TestReserveSettleChargeOverHTTP(t *testing.T) {
	l := reserveLimiter(t)
	check := httpapi.NewCheckHandler(l, "tok", nil)
	sh := httpapi.NewSettleHandler(l, "tok", nil)
	settle, charge := sh.Settle(), sh.Charge()
	auth := []string{"Authorization", "Bearer tok"}

	w := post(t, check, `{"key":"acct_1","scope":"llm:tokens","cost":300,"reserve":true}`, auth...)
	var d struct {
		Allowed     bool   `json:"allowed"`
		Remaining   int64  `json:"remaining"`
		Reservation string `json:"reservation"`
	}
	decodeInto(t, w.Body.String(), &d)
	if w.Code != 200 || !d.Allowed || d.Reservation == "" || d.Remaining != 700 {
		t.Fatalf("reserve: %d %s", w.Code, w.Body)
	}
	// The general decoder agrees with the fast one on "reserve".
	w = post(t, check, `{"scope":"llm:tokens","key":"acct_1","reserve":true,"cost":1e1,"extra":1}`, auth...)
	decodeInto(t, w.Body.String(), &d)
	if d.Reservation == "" || d.Remaining != 690 {
		t.Fatalf("reserve through the general decoder: %s", w.Body)
	}
	w = post(t, check, `{"key":"acct_1","scope":"llm:tokens","cost":1}`, auth...)
	if strings.Contains(w.Body.String(), "reservation") {
		t.Fatalf("a plain check carries a reservation: %s", w.Body)
	}

	w = post(t, settle, `{"reservation":"`+d.Reservation+`","cost":4}`, auth...)
	var s settleResponse
	decodeInto(t, w.Body.String(), &s)
	if w.Code != 200 || !*s.Settled || *s.Charged != 4 || *s.Refunded != 6 || *s.Remaining != 695 || *s.Debt != 0 {
		t.Fatalf("settle: %d %s", w.Code, w.Body)
	}
	if w = post(t, settle, `{"reservation":"`+d.Reservation+`","cost":4}`, auth...); w.Code != 409 || !strings.Contains(w.Body.String(), `"already_settled"`) {
		t.Fatalf("second settle: %d %s", w.Code, w.Body)
	}
	if w = post(t, settle, `{"reservation":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","cost":4}`, auth...); w.Code != 404 || !strings.Contains(w.Body.String(), `"reservation_not_found"`) {
		t.Fatalf("unknown id: %d %s", w.Code, w.Body)
	}
	w = post(t, charge, `{"key":"acct_1","scope":"llm:tokens","cost":2000}`, auth...)
	s = settleResponse{}
	decodeInto(t, w.Body.String(), &s)
	if w.Code != 200 || *s.Charged != 2000 || *s.Remaining != -1305 || *s.Debt != 1305 || s.Settled != nil {
		t.Fatalf("charge into debt: %d %s", w.Code, w.Body)
	}
	w = post(t, check, `{"key":"acct_1","scope":"llm:tokens","cost":0}`, auth...)
	var rej struct {
		Allowed      bool  `json:"allowed"`
		RetryAfterMs int64 `json:"retryAfterMs"`
	}
	decodeInto(t, w.Body.String(), &rej)
	if rej.Allowed || rej.RetryAfterMs < 1304*3600*1000 {
		t.Fatalf("cost 0 in debt: %s", w.Body)
	}

	for _, c := range []struct {
		h    string
		body string
		code int
		msg  string
	}{
		{"settle", `{"cost":1}`, 400, "reservation is required"},
		{"settle", `{"reservation":"x"}`, 400, "cost is required"},
		{"settle", `{"reservation":"x","cost":-1}`, 400, "cost must be an integer"},
		{"settle", `{"reservation":"x","cost":1.5}`, 400, "cost must be an integer"},
		{"settle", `{"reservation":7,"cost":1}`, 400, "reservation must be a string"},
		{"settle", `{"reservation":"` + strings.Repeat("A", 5000) + `","cost":1}`, 400, "at most 4096"},
		{"settle", `[1]`, 400, "not a JSON object"},
		{"settle", `{"reservation":"x","cost":1}`, 404, "reservation_not_found"},
		{"charge", `{"key":"a","scope":"s"}`, 400, "cost is required"},
		{"charge", `{"key":"a","cost":1}`, 400, "scope is required"},
		{"charge", `{"key":"a","scope":"s","cost":1,"reserve":true}`, 400, "reserve is not valid"},
		{"charge", `{"key":"a","scope":"s","cost":1000000001}`, 400, "cost must be an integer"},
		{"check", `{"key":"a","scope":"s","reserve":"yes"}`, 400, "reserve must be a boolean"},
	} {
		h := map[string]http.Handler{"settle": settle, "charge": charge, "check": check}[c.h]
		w := post(t, h, c.body, auth...)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.msg) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.h, c.body[:min(len(c.body), 60)], w.Code, w.Body, c.code, c.msg)
		}
	}
	if w := post(t, settle, `{"reservation":"x","cost":1}`); w.Code != 401 {
		t.Errorf("settle without the token: %d", w.Code)
	}
	if w := post(t, charge, `{"key":"a","scope":"s","cost":1}`, "Authorization", "Bearer wrong"); w.Code != 401 {
		t.Errorf("charge with a wrong token: %d", w.Code)
	}
	if w := post(t, settle, `{"reservation":"x","cost":1}`); w.Code != 401 {
		t.Errorf("settle without the token: %d", w.Code)
	}
	if w := post(t, charge, `{"key":"a","scope":"s","cost":1}`, "Authorization", "Bearer wrong"); w.Code != 401 {
		t.Errorf("charge with a wrong token: %d", w.Code)
	}
}
