package httpapi_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/policy"
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
	l, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 100), Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
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
