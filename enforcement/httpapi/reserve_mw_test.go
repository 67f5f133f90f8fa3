package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/policy"
)

// memReserveLimiter is a single-node limiter that keeps reservations:
// 100 tokens refilling 1 an hour.
func memReserveLimiter(t *testing.T) *enforcement.Limiter {
	t.Helper()
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1, period: hour, burst: 100 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	mem := enforcement.NewMemoryAuthority(nil, 1000)
	l, err := enforcement.New(enforcement.Config{Authority: mem, Reservations: mem, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func remainingOf(t *testing.T, l *enforcement.Limiter, key string) int64 {
	t.Helper()
	s, err := l.Charge(context.Background(), enforcement.Request{Key: key, Scope: "GET /gen", Cost: 0, HasCost: true})
	if err != nil {
		t.Fatal(err)
	}
	return s.Remaining
}

func TestReserveMiddlewareSettlesTheActualCost(t *testing.T) {
	l := memReserveLimiter(t)
	g := &httpapi.Guard{Checker: l, Key: httpapi.HeaderKey("X-Key", ""),
		Cost: func(*http.Request) (int64, bool) { return 20, true }}
	var handler http.HandlerFunc
	mux := http.NewServeMux()
	mux.HandleFunc("GET /gen", func(w http.ResponseWriter, r *http.Request) { handler(w, r) })
	h := httpapi.ReserveMiddleware(g, l)(mux)
	serve := func(key string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/gen", nil)
		r.Header.Set("X-Key", key)
		h.ServeHTTP(w, r)
		return w
	}

	// The handler reports 70: the estimate of 20 and 50 more.
	handler = func(w http.ResponseWriter, r *http.Request) {
		if !httpapi.SetActualCost(r.Context(), 30) || !httpapi.AddActualCost(r.Context(), 40) {
			t.Error("no reservation in the handler's context")
		}
	}
	if w := serve("a"); w.Code != 200 {
		t.Fatalf("reserved request: %d %s", w.Code, w.Body)
	}
	if got := remainingOf(t, l, "a"); got != 30 {
		t.Fatalf("after an actual cost of 70: %d left, want 30", got)
	}
	// Reporting nothing settles at the estimate.
	handler = func(http.ResponseWriter, *http.Request) {}
	serve("b")
	if got := remainingOf(t, l, "b"); got != 80 {
		t.Fatalf("after no report: %d left, want 80", got)
	}
	// A panicking handler is settled, and the panic goes on.
	handler = func(_ http.ResponseWriter, r *http.Request) {
		httpapi.SetActualCost(r.Context(), 150)
		panic("boom")
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		serve("c")
	}()
	if got := remainingOf(t, l, "c"); got != -50 {
		t.Fatalf("after a panic that reported 150: %d left, want -50", got)
	}
	// In debt the request is rejected before the handler runs.
	ran := false
	handler = func(http.ResponseWriter, *http.Request) { ran = true }
	if w := serve("c"); w.Code != 429 || ran {
		t.Fatalf("in debt: %d, handler ran %v", w.Code, ran)
	}
	// Outside the middleware the helper says so.
	if httpapi.SetActualCost(context.Background(), 1) {
		t.Fatal("SetActualCost outside a reservation reported true")
	}
}
