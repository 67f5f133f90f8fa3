package ginlimit_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/ginlimit"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestGinMiddleware(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1, burst: 2 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "gin"), Policy: pol})
	if err != nil {
		t.Fatal(err)
	}

	var scopes []string
	gin.SetMode(gin.TestMode)
	engine := gin.New()
	engine.Use(ginlimit.Middleware(&httpapi.Guard{Checker: lim, Key: httpapi.HeaderKey("X-API-Key", "key:")}))
	engine.GET("/items/:id", func(c *gin.Context) {
		scopes = append(scopes, c.FullPath())
		c.String(200, "ok")
	})
	codes := []int{}
	var last *httptest.ResponseRecorder
	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/items/"+string(rune('a'+i)), nil) // distinct paths, one route
		req.Header.Set("X-API-Key", "k")
		engine.ServeHTTP(w, req)
		codes = append(codes, w.Code)
		last = w
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("codes %v: the route template must be the scope, so three paths share one bucket", codes)
	}
	if last.Header().Get("Retry-After") != "1" || last.Header().Get("RateLimit-Limit") != "2" || !strings.Contains(last.Body.String(), "rate_limited") {
		t.Fatalf("429 response: %v %s", last.Header(), last.Body)
	}
	// The IETF draft's fields beside the legacy trio (mode both, the
	// default), and the 429 as the draft's quota-exceeded problem.
	if last.Header().Get("RateLimit-Policy") != `"free";q=2;w=2` || last.Header().Get("RateLimit") != `"free";r=0;t=1` ||
		last.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(last.Body.String(), `"type":"https://iana.org/assignments/http-problem-types#quota-exceeded"`) {
		t.Fatalf("429 draft fields: %v %s", last.Header(), last.Body)
	}
	if len(scopes) != 2 {
		t.Fatalf("handler ran %d times, want 2 (the 429 must abort)", len(scopes))
	}
}
