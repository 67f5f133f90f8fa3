package ginlimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/ginlimit"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/policy"
)

func TestGinReserveMiddlewareSettlesEvenOnPanic(t *testing.T) {
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1, period: hour, burst: 100 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	mem := enforcement.NewMemoryAuthority(nil, 1000)
	lim, err := enforcement.New(enforcement.Config{Authority: mem, Reservations: mem, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.TestMode)
	engine := gin.New()
	engine.Use(gin.Recovery())
	engine.Use(ginlimit.ReserveMiddleware(&httpapi.Guard{Checker: lim, Key: httpapi.HeaderKey("X-Key", ""),
		Cost: func(*http.Request) (int64, bool) { return 10, true }}, lim))
	engine.GET("/gen/:id", func(c *gin.Context) {
		httpapi.SetActualCost(c.Request.Context(), 35)
		if c.Param("id") == "panic" {
			panic("boom")
		}
		c.String(200, "ok")
	})
	for _, path := range []string{"/gen/1", "/gen/panic"} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("X-Key", "k")
		engine.ServeHTTP(w, r)
		if want := map[string]int{"/gen/1": 200, "/gen/panic": 500}[path]; w.Code != want {
			t.Fatalf("%s: %d, want %d", path, w.Code, want)
		}
	}
	s, err := lim.Charge(context.Background(), enforcement.Request{Key: "k", Scope: "GET /gen/:id", Cost: 0, HasCost: true})
	if err != nil || s.Remaining != 30 {
		t.Fatalf("after two requests of actual cost 35 (one panicked): %+v, %v; want 30 left", s, err)
	}
}
