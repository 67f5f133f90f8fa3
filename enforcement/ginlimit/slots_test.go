package ginlimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/ginlimit"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestGinMiddlewareGivesTheSlotBack: behind gin, a request on a
// concurrency limit holds its slot while the handlers run and gives it
// back when they return, and when one panics (to gin's recovery): the
// store holds no slot after either, and the limit is never used up by them.
func TestGinMiddlewareGivesTheSlotBack(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { concurrency: 1 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "gin"), Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	c := redisstore.NewConcurrency(rdb, "gin")
	gate, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: c, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.TestMode)
	engine := gin.New()
	engine.Use(gin.Recovery())
	engine.Use(ginlimit.Middleware(&httpapi.Guard{Checker: gate, Key: httpapi.HeaderKey("X-Key", "")}))
	engine.GET("/report/:id", func(ctx *gin.Context) {
		n, err := c.Held(ctx.Request.Context(), rdb, "k", "GET /report/:id")
		if err != nil || n != 1 {
			t.Errorf("inside the handler: %d held, %v", n, err)
		}
		if ctx.Param("id") == "panic" {
			panic("boom")
		}
		ctx.String(200, "ok")
	})
	for _, path := range []string{"/report/1", "/report/panic", "/report/2", "/report/panic", "/report/3"} {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("X-Key", "k")
		engine.ServeHTTP(w, req)
		if want := map[bool]int{false: 200, true: 500}[path == "/report/panic"]; w.Code != want {
			t.Fatalf("%s: %d, want %d (%s)", path, w.Code, want, w.Body)
		}
		if n, err := c.Held(context.Background(), rdb, "k", "GET /report/:id"); err != nil || n != 0 {
			t.Fatalf("after %s: %d held, %v", path, n, err)
		}
	}
}
