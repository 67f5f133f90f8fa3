package spans

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/otlptest"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
)

// nopWriter is the cheapest http.ResponseWriter.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkCheckTracing: POST /check as the limiter serves it (the route
// wrapper, the decision span, the store-call span; the in-process
// authority), with tracing off, at 1% (parentbased_traceidratio 0.01, the
// requests carrying no traceparent) and with every request sampled,
// exporting to a real OTLP/HTTP receiver. cpu-ns/op is the whole
// process's CPU per request (the exporter's goroutine included).
func BenchmarkCheckTracing(b *testing.B) {
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1000000000, burst: 1000000000 }\n"))
	if err != nil {
		b.Fatal(err)
	}
	rcv := otlptest.StartHTTP(b)
	for _, c := range []struct{ name, sampler, arg string }{
		{"off", "", ""},
		{"sampled-1pct", "parentbased_traceidratio", "0.01"},
		{"sampled-all", "always_on", ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			env := map[string]string{"OTEL_TRACES_SAMPLER": c.sampler, "OTEL_TRACES_SAMPLER_ARG": c.arg}
			if c.name != "off" {
				env["OTEL_EXPORTER_OTLP_ENDPOINT"] = rcv.Endpoint()
				b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint()) // the exporter reads the process's
			} else {
				os.Unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT")
			}
			tr, err := tracing.New(func(k string) string { return env[k] }, "limiter")
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Shutdown(context.Background())
			lim, err := enforcement.New(enforcement.Config{Authority: Authority(tr, enforcement.NewMemoryAuthority(nil, 1000), "memory"), Policy: pol})
			if err != nil {
				b.Fatal(err)
			}
			h := tr.Handler("POST /check", httpapi.NewCheckHandler(Check(tr, lim), "", nil))
			body := []byte(`{"key":"acct_1","scope":"api"}`)
			rd := bytes.NewReader(body)
			r, _ := http.NewRequest(http.MethodPost, "/check", io.NopCloser(rd))
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			cpu0 := proccpu.Self()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rd.Reset(body)
				r.ContentLength = int64(len(body))
				h.ServeHTTP(w, r)
			}
			b.StopTimer()
			b.ReportMetric(float64(proccpu.Self()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
