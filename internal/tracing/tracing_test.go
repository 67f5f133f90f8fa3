package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/testkit/otlptest"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestOffWithoutAnEndpoint(t *testing.T) {
	for _, vars := range []map[string]string{
		{},
		{"OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "x"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
	} {
		p, err := tracing.New(env(vars), "limiter")
		if err != nil {
			t.Fatalf("%v: %v", vars, err)
		}
		if p.Enabled() {
			t.Fatalf("%v: tracing on", vars)
		}
		var handler http.Handler = http.NewServeMux()
		if got := p.Handler("GET /", handler); got != handler {
			t.Fatal("with tracing off, Handler must return the handler itself")
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEveryBadVariableIsReported(t *testing.T) {
	_, err := tracing.New(env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "not a url",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
		"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":     "2",
		"OTEL_SDK_DISABLED":           "maybe",
	}), "limiter")
	if err == nil {
		t.Fatal("no error")
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	if _, err := tracing.New(env(map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}), "x"); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_SAMPLER") {
		t.Errorf("unknown sampler: %v", err)
	}
}

func TestSamplerFrom(t *testing.T) {
	for _, c := range []struct{ name, arg, want string }{
		{"", "", "ParentBased{root:AlwaysOnSampler"},
		{"always_off", "", "AlwaysOffSampler"},
		{"traceidratio", "0.01", "TraceIDRatioBased{0.01}"},
		{"parentbased_traceidratio", "0.01", "ParentBased{root:TraceIDRatioBased{0.01}"},
		{"parentbased_always_off", "", "ParentBased{root:AlwaysOffSampler"},
	} {
		s, err := tracing.SamplerFrom(env(map[string]string{"OTEL_TRACES_SAMPLER": c.name, "OTEL_TRACES_SAMPLER_ARG": c.arg}))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !strings.HasPrefix(s.Description(), c.want) {
			t.Errorf("%s %s: %s, want %s...", c.name, c.arg, s.Description(), c.want)
		}
	}
}

// Handler continues the caller's trace (W3C traceparent) and the span
// reaches a real OTLP receiver, over each protocol, with the service name
// of OTEL_SERVICE_NAME; nothing is exported before the first span ends.
func TestHandlerContinuesTheCallersTrace(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			var rcv *otlptest.Receiver
			if protocol == "grpc" {
				rcv = otlptest.StartGRPC(t)
			} else {
				rcv = otlptest.StartHTTP(t)
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			t.Setenv("OTEL_SERVICE_NAME", "edge-limiter")
			p, err := tracing.New(os.Getenv, "limiter")
			if err != nil {
				t.Fatal(err)
			}
			if !p.Enabled() || p.Protocol() != protocol {
				t.Fatalf("enabled %v protocol %q", p.Enabled(), p.Protocol())
			}
			h := p.Handler("POST /check", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/check", nil)
			req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			// The span ends as the handler returns, which the client
			// need not wait for: the server is closed (it waits for
			// the request) before the provider flushes.
			srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.Shutdown(ctx); err != nil { // flushes
				t.Fatal(err)
			}
			spans := rcv.Wait(t, "the /check span", 30*time.Second, func(s []otlptest.Span) bool { return len(s) > 0 })
			s := spans[0]
			if s.Name != "POST /check" || s.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || s.ParentSpanID != "00f067aa0ba902b7" {
				t.Fatalf("span %+v: want POST /check in the caller's trace, child of its span", s)
			}
			if s.Service != "edge-limiter" || s.Attributes["http.response.status_code"] != "429" || s.Attributes["http.route"] != "POST /check" {
				t.Fatalf("span %+v: service or attributes", s)
			}
		})
	}
}

// New starts nothing: no goroutine until a sampled span ends, and a
// Provider shut down before any span never contacts the collector.
func TestNewStartsNothing(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	started := startedHere()
	p, err := tracing.New(os.Getenv, "limiter")
	if err != nil {
		t.Fatal(err)
	}
	if gs := started(); len(gs) != 0 {
		t.Fatalf("New started %d goroutines:\n%s", len(gs), strings.Join(gs, "\n\n"))
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := rcv.Requests(); n != 0 {
		t.Fatalf("%d export requests without a span", n)
	}
}

// startedHere returns a function that lists the goroutines the calling
// goroutine has started since startedHere was called and that are still
// running (a goroutine not yet scheduled included: "created by … in
// goroutine N" names its creator). The process's whole count is not the
// measure: goroutines of earlier tests' servers and connections end on
// their own schedule.
func startedHere() func() []string {
	self := strings.Fields(string(stacks(false)))[1]
	before := map[string]bool{}
	for _, g := range strings.Split(string(stacks(true)), "\n\n") {
		before[strings.Fields(g)[1]] = true
	}
	return func() []string {
		var out []string
		for _, g := range strings.Split(string(stacks(true)), "\n\n") {
			if id := strings.Fields(g)[1]; !before[id] && strings.Contains(g, " in goroutine "+self+"\n") {
				out = append(out, g)
			}
		}
		return out
	}
}

func stacks(all bool) []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, all)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A request without a traceparent is sampled by the configured ratio on a
// trace id drawn before the tracer is called: the kept ones reach the
// receiver with that id (the SDK's sampler, given the same id, agrees),
// and every other one is served with the caller's own request and writer.
func TestHandlerSamplesNewTracesByTheRatio(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
	p, err := tracing.New(os.Getenv, "limiter")
	if err != nil {
		t.Fatal(err)
	}
	var req *http.Request
	var rec *httptest.ResponseRecorder
	sampled := map[string]bool{}
	untouched := 0
	h := p.Handler("POST /check", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := trace.SpanContextFromContext(r.Context())
		switch {
		case r == req && w == http.ResponseWriter(rec) && !sc.IsValid():
			untouched++
		case sc.IsSampled() && r != req:
			sampled[sc.TraceID().String()] = true
		default:
			t.Errorf("request served with span %v, own request %v", sc, r == req)
		}
	}))
	const n = 400
	for range n {
		req = httptest.NewRequest(http.MethodPost, "/check", nil)
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, req)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Half on average: outside [100, 300] once in more than 10^20 runs.
	if len(sampled) < 100 || len(sampled) > 300 || untouched+len(sampled) != n {
		t.Fatalf("%d sampled, %d served untouched, of %d", len(sampled), untouched, n)
	}
	spans := rcv.Wait(t, "the sampled spans", 30*time.Second, func(s []otlptest.Span) bool { return len(s) >= len(sampled) })
	if len(spans) != len(sampled) {
		t.Fatalf("%d spans exported, %d requests sampled", len(spans), len(sampled))
	}
	for _, s := range spans {
		if !sampled[s.TraceID] || s.ParentSpanID != "" {
			t.Errorf("span %+v: not one of the sampled requests' roots", s)
		}
		// TraceIDRatioBased(0.5): the id's 9th byte is below 0x80.
		if b, _ := strconv.ParseUint(s.TraceID[16:18], 16, 8); b >= 0x80 {
			t.Errorf("trace %s kept, but the ratio rule drops it", s.TraceID)
		}
	}
}

// A request that the sampler drops before any span allocates nothing in
// Handler (testing.AllocsPerRun counts, machine speed aside).
func TestUnsampledRequestAllocatesNothing(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // never reached: nothing is sampled
	for _, c := range []struct{ sampler, arg string }{
		{"parentbased_traceidratio", "1e-15"}, {"traceidratio", "1e-15"}, {"parentbased_always_off", ""},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.sampler)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
		p, err := tracing.New(os.Getenv, "limiter")
		if err != nil {
			t.Fatal(err)
		}
		h := p.Handler("POST /check", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		req, rec := httptest.NewRequest(http.MethodPost, "/check", nil), httptest.NewRecorder()
		if a := testing.AllocsPerRun(1000, func() { h.ServeHTTP(rec, req) }); a != 0 {
			t.Errorf("%s %s: %v allocations per unsampled request", c.sampler, c.arg, a)
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
