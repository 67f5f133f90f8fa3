package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/policy"
)

// Protecting a Go service in-process: identity first (X-API-Key), client
// address as the fallback, forwarded headers believed only from 10.0.0.0/8.
// With Redis, use redisstore.New(redisClient, "") as the Authority instead
// of the single-node in-process one.
func ExampleMiddleware() {
	pol, err := policy.Parse([]byte(`
version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 2 }
`))
	if err != nil {
		panic(err)
	}
	// A clock that stands still keeps the printed retry time exact however
	// slow the machine; a service leaves both clocks nil (time.Now).
	now := time.Now()
	clock := func() time.Time { return now }
	lim, err := enforcement.New(enforcement.Config{
		Authority: enforcement.NewMemoryAuthority(clock, 100_000), // single instance only
		Policy:    pol,
		Now:       clock,
	})
	if err != nil {
		panic(err)
	}
	proxies, _ := httpapi.NewProxies("10.0.0.0/8")
	guard := &httpapi.Guard{
		Checker: lim,
		Key:     httpapi.FirstKey(httpapi.HeaderKey("X-API-Key", "key:"), httpapi.AddressKey(proxies)),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	handler := httpapi.Middleware(guard)(mux)

	for i := 0; i < 3; i++ {
		req := httptest.NewRequest(http.MethodGet, "/hello", nil)
		req.Header.Set("X-API-Key", "acct_1")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="1"
}
