package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
)

// nopWriter is the cheapest http.ResponseWriter: the benchmark measures the
// handler, not a recorder.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkCheckHandlerLocalReject: POST /check for a flooded key, decided
// by the local tier — the handler's own cost (body, JSON both ways, the
// decision) without net/http's connection handling.
func BenchmarkCheckHandlerLocalReject(b *testing.B) {
	pol, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		b.Fatal(err)
	}
	l, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1<<20), Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	h := httpapi.NewCheckHandler(l, "", nil)
	body := []byte(`{"key":"acct_free","scope":"api:orders"}`)
	rd := bytes.NewReader(body)
	r, _ := http.NewRequest(http.MethodPost, "/check", io.NopCloser(rd))
	w := &nopWriter{h: http.Header{}}
	for range 200 { // spend the burst
		rd.Reset(body)
		h.ServeHTTP(w, r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd.Reset(body)
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	}
}

// BenchmarkCheckHandlerAllowed: POST /check answered "allowed" by the
// in-process authority, keys spread so that no bucket empties.
func BenchmarkCheckHandlerAllowed(b *testing.B) {
	h := httpapi.NewCheckHandler(benchLimiter(b), "", nil)
	benchAllowed(b, h)
}

func benchLimiter(b *testing.B) *enforcement.Limiter {
	b.Helper()
	pol, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		b.Fatal(err)
	}
	l, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1<<16), Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func benchAllowed(b *testing.B, h http.Handler) {
	bodies := make([][]byte, 4096)
	for i := range bodies {
		bodies[i] = []byte(`{"key":"acct_pro` + strconv.Itoa(i) + `","scope":"api:orders","tier":"pro"}`)
	}
	rd := bytes.NewReader(nil)
	r, _ := http.NewRequest(http.MethodPost, "/check", io.NopCloser(rd))
	w := &nopWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := proccpu.Self()
	for i := 0; i < b.N; i++ {
		body := bodies[i%len(bodies)]
		rd.Reset(body)
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	}
	reportCPU(b, cpu0)
}

// reportCPU adds cpu-ns/op, the process's CPU time (garbage collection
// included) per operation: a machine shared with other work stretches
// ns/op, not this.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(proccpu.Self()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkMiddlewareAllowed: the net/http middleware's cost for an allowed
// request (headers set on a reused header map, the next handler empty).
func BenchmarkMiddlewareAllowed(b *testing.B) {
	benchMiddleware(b, nil)
}

func benchMiddleware(b *testing.B, set func(*httpapi.Guard)) {
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 1000000, burst: 1000000 }\n"))
	if err != nil {
		b.Fatal(err)
	}
	l, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1<<16), Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	g := &httpapi.Guard{Checker: l, Key: httpapi.HeaderKey("X-API-Key", "key:"),
		Scope: func(*http.Request) string { return "api:orders" }}
	if set != nil {
		set(g)
	}
	h := httpapi.Middleware(g)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	reqs := make([]*http.Request, 4096)
	for i := range reqs {
		reqs[i], _ = http.NewRequest(http.MethodGet, "/items", nil)
		reqs[i].Header.Set("X-API-Key", "k"+strconv.Itoa(i))
	}
	w := &nopWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := proccpu.Self()
	for i := 0; i < b.N; i++ {
		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
	reportCPU(b, cpu0)
}

// BenchmarkMiddlewareAllowedLegacy: the legacy trio only, as before the
// draft's fields (compare with BenchmarkMiddlewareAllowed, mode both).
func BenchmarkMiddlewareAllowedLegacy(b *testing.B) {
	benchMiddleware(b, func(g *httpapi.Guard) { g.Headers = ratelimitheader.Legacy })
}

// BenchmarkCheckHandlerAllowedNoHeaders: /check without its "headers"
// object (LIMITER_HEADERS=none), the answer as it was before it.
func BenchmarkCheckHandlerAllowedNoHeaders(b *testing.B) {
	h := httpapi.NewCheckHandler(benchLimiter(b), "", nil)
	h.SetHeaderMode(ratelimitheader.None)
	benchAllowed(b, h)
}
