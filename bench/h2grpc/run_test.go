package h2grpc

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratewarden/ratewarden/bench/rlsreq"
)

// rls is a real grpc-go rate limit service whose answer the descriptor's
// value chooses: "ok…" OK, "over…" OVER_LIMIT, "err…" the gRPC error
// RESOURCE_EXHAUSTED, "big…" OK with ~150 KB of response headers (more
// than the client's flow-control window). It counts what it answered and
// the most calls it had in flight at once.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	ok, over, errs    atomic.Int64
	inFlight, maxSeen atomic.Int64
	hold              time.Duration
}

func (r *rls) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for {
		m := r.maxSeen.Load()
		if n <= m || r.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-time.After(r.hold):
	case <-ctx.Done(): // past its deadline, given up by the client, or the server stopping
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	v := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	switch {
	case strings.HasPrefix(v, "over"):
		r.over.Add(1)
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	case strings.HasPrefix(v, "err"):
		r.errs.Add(1)
		return nil, status.Error(codes.ResourceExhausted, "asked to fail")
	case strings.HasPrefix(v, "big"):
		r.ok.Add(1)
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
		for i := range 1500 {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "x-h" + strconv.Itoa(i), Value: strings.Repeat("v", 90)})
		}
		return resp, nil
	}
	r.ok.Add(1)
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func serve(t *testing.T, svc *rls, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return ln.Addr().String()
}

// bodies frames one request per value, in order.
func bodies(t *testing.T, domain string, values ...string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, v := range values {
		b, err := rlsreq.Frames(rlsreq.Requests(1, domain, v, true))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

func config(addr string, b [][]byte) Config {
	return Config{Addr: addr, Path: rlsreq.Method, Bodies: b, Conns: 2, Streams: 16,
		Grace: time.Minute, Classify: rlsreq.Classify, Outcomes: rlsreq.Outcomes}
}

// Every call is counted once, by what the server answered: OK and
// OVER_LIMIT by the response's overall code, a gRPC error by its status.
func TestCountsWhatTheServerAnswered(t *testing.T) {
	svc := &rls{hold: time.Millisecond}
	addr := serve(t, svc)
	cfg := config(addr, bodies(t, "bench", "ok1", "ok2", "ok3", "ok4", "ok5", "over1", "over2", "over3", "err1", "err2"))
	cfg.Calls = 1000 // 100 rounds of the 10 bodies
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.Text())
	want := map[string]int64{"ok": 500, "over_limit": 300, "other_code": 0}
	for k, v := range want {
		if res.Outcomes[k] != v {
			t.Errorf("outcome %s = %d, want %d", k, res.Outcomes[k], v)
		}
	}
	if len(res.Errors) != 1 || res.Errors["grpc-status ResourceExhausted"] != 200 || res.Samples["grpc-status ResourceExhausted"] != "asked to fail" {
		t.Errorf("errors %v (samples %v), want 200 grpc-status ResourceExhausted", res.Errors, res.Samples)
	}
	if res.Calls != 1000 || svc.ok.Load() != 500 || svc.over.Load() != 300 || svc.errs.Load() != 200 {
		t.Errorf("client counted %d calls; the server answered ok %d, over %d, errors %d", res.Calls, svc.ok.Load(), svc.over.Load(), svc.errs.Load())
	}
	if res.Latency.TotalCount() != 800 {
		t.Errorf("%d latencies recorded, want one per answered call (800)", res.Latency.TotalCount())
	}
}

// Requests and answers larger than the flow-control windows go through
// (WINDOW_UPDATEs both ways), and the server's MAX_CONCURRENT_STREAMS
// holds however many streams the client was asked for: no stream is
// refused.
func TestFlowControlAndStreamLimit(t *testing.T) {
	svc := &rls{hold: 2 * time.Millisecond}
	addr := serve(t, svc, grpc.MaxConcurrentStreams(2), grpc.MaxRecvMsgSize(1<<20),
		grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	domain := strings.Repeat("d", 200<<10) // a 200 KB request: three times the server's stream window
	cfg := config(addr, bodies(t, domain, "big1", "ok1"))
	cfg.Conns, cfg.Streams, cfg.Calls = 1, 8, 40
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.Text())
	if res.ErrorCount() != 0 || res.Outcomes["ok"] != 40 {
		t.Fatalf("outcomes %v errors %v (%v), want 40 ok", res.Outcomes, res.Errors, res.Samples)
	}
	if m := svc.maxSeen.Load(); m > 2 {
		t.Fatalf("the server had %d calls in flight on one connection, its limit is 2", m)
	}
}

// At a fixed rate every due call is either sent (and answered) or
// counted as dropped, never more than the schedule holds.
func TestOpenModel(t *testing.T) {
	svc := &rls{}
	addr := serve(t, svc)
	cfg := config(addr, bodies(t, "bench", "ok1", "over1"))
	cfg.Rate, cfg.Duration = 400, time.Second
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.Text())
	sent := svc.ok.Load() + svc.over.Load()
	if res.ErrorCount() != 0 || res.Calls != sent || res.Calls == 0 {
		t.Fatalf("client counted %d calls (errors %v), the server answered %d", res.Calls, res.Errors, sent)
	}
	// The schedule holds 400 calls (one more per connection at the edges).
	if due := res.Calls + res.Dropped; due > 400+int64(cfg.Conns) {
		t.Fatalf("%d calls sent or dropped, the schedule holds 400", due)
	}
	if d := res.Outcomes["ok"] - res.Outcomes["over_limit"]; d < -1 || d > 1 {
		t.Fatalf("round robin over two bodies answered %v", res.Outcomes)
	}
}

// A server that is not there is an error of Run, not an empty result.
func TestNoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := config(addr, bodies(t, "bench", "ok1"))
	cfg.Calls = 1
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), fmt.Sprint(addr)) {
		t.Fatalf("Run against nothing: %v", err)
	}
}

// grpc-go honours the header: a call past it ends as an error (grpc-go
// resets the stream, RST_STREAM CANCEL), counted, not answered.
func TestTimeoutHeader(t *testing.T) {
	if h := Timeout(1500 * time.Microsecond); h != [2]string{"grpc-timeout", "2m"} {
		t.Fatalf("Timeout(1.5ms) = %v", h)
	}
	svc := &rls{hold: 200 * time.Millisecond}
	addr := serve(t, svc)
	cfg := config(addr, bodies(t, "bench", "ok1"))
	cfg.Headers = [][2]string{Timeout(time.Millisecond)}
	cfg.Conns, cfg.Streams, cfg.Calls = 1, 2, 4
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorCount() != 4 || res.Calls != 4 || res.Outcomes["ok"] != 0 {
		t.Fatalf("calls %d, outcomes %v, errors %v; want 4 calls past their deadline", res.Calls, res.Outcomes, res.Errors)
	}
}

// Calls still unanswered when the grace period ends are cut and counted
// as errors: a run ends however the server behaves.
func TestUnansweredCallsAreCounted(t *testing.T) {
	svc := &rls{hold: 10 * time.Minute}
	addr := serve(t, svc)
	cfg := config(addr, bodies(t, "bench", "ok1"))
	cfg.Duration, cfg.Grace = 200*time.Millisecond, 300*time.Millisecond
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := res.Errors["unanswered at the end"]; n != int64(cfg.Streams) || res.Calls != n || res.ErrorCount() != n {
		t.Fatalf("calls %d, errors %v; want the %d calls in flight counted as unanswered", res.Calls, res.Errors, cfg.Streams)
	}
}
