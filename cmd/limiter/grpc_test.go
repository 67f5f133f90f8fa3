package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The Envoy client calls of the tests (testkit/testenv).
var (
	dial = testenv.DialGRPC
	desc = testenv.Descriptor
	rls  = testenv.ShouldRateLimit
)

// startEnvoyLimiter starts the limiter binary with the gRPC service on a
// free port and returns it with that address.
func startEnvoyLimiter(t *testing.T, policyYAML string, env ...string) (*limiterProc, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := startLimiter(t, policyYAML, append([]string{"LIMITER_GRPC_ADDR=" + addr}, env...)...)
	return p, addr
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	out := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		out[h.GetKey()] = h.GetValue()
	}
	return out
}

func wantCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), contains) {
		t.Errorf("got %v, want %s containing %q", err, code, contains)
	}
}

// TestEnvoyRLSContract: the Envoy rate limit service of the real binary,
// with real Redis, through go-control-plane's client: every field of the
// response, the documented edge cases, and the same bucket as /check.
func TestEnvoyRLSContract(t *testing.T) {
	r := testenv.StartRedis(t)
	p, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "REDIS_ADDRS="+r.Addr(), "LIMITER_STORE_TIMEOUT=2s")
	c := rlsv3.NewRateLimitServiceClient(dial(t, addr))

	t.Run("allowed: every field", func(t *testing.T) {
		before := time.Now()
		resp := rls(t, c, "edge", 0, desc("remote_address", "10.0.0.1"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 1 {
			t.Fatalf("%v", resp)
		}
		st := resp.Statuses[0]
		if st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 2 {
			t.Errorf("status %v, want OK with 2 remaining", st)
		}
		cl := st.GetCurrentLimit()
		if cl.GetName() != "anonymous" || cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("current_limit %v, want anonymous 10/MINUTE", cl)
		}
		// One token spent at 10/min: full again in 6 s.
		if d := st.GetDurationUntilReset().AsDuration(); d <= 5*time.Second || d > 6*time.Second+time.Since(before) {
			t.Errorf("duration_until_reset %v, want about 6s", d)
		}
		h := headerMap(resp)
		for k, v := range map[string]string{"x-ratelimit-limit": "3", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "6",
			"ratelimit-limit": "3", "ratelimit-remaining": "2", "ratelimit-reset": "6"} {
			if h[k] != v {
				t.Errorf("header %s = %q, want %q (all: %v)", k, h[k], v, h)
			}
		}
		if _, ok := h["retry-after"]; ok {
			t.Errorf("retry-after on an allowed request: %v", h)
		}
		if resp.RawBody != nil || resp.RequestHeadersToAdd != nil || resp.DynamicMetadata != nil || resp.Quota != nil {
			t.Errorf("unexpected fields: %v", resp)
		}
	})

	t.Run("over the limit", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			rls(t, c, "edge", 0, desc("remote_address", "10.0.0.1"))
		}
		resp := rls(t, c, "edge", 0, desc("remote_address", "10.0.0.1"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%v, want OVER_LIMIT", resp)
		}
		st := resp.Statuses[0]
		if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 || st.GetCurrentLimit().GetName() != "anonymous" {
			t.Errorf("status %v", st)
		}
		h := headerMap(resp)
		// Empty bucket at 10/min: the next token in 6 s, full in 18 s.
		if h["retry-after"] != "6" || h["ratelimit-remaining"] != "0" || h["x-ratelimit-reset"] != "18" {
			t.Errorf("headers %v, want retry-after 6, remaining 0, reset 18", h)
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 17*time.Second || d > 18*time.Second {
			t.Errorf("duration_until_reset %v, want about 18s", d)
		}
	})

	t.Run("same key and scope as /check spend the same bucket", func(t *testing.T) {
		resp := rls(t, c, "edge", 0, desc("api_key", "k_pro", "path", "/search"))
		if got := resp.Statuses[0].LimitRemaining; got != 5 {
			t.Fatalf("remaining %d after one gRPC decision, want 5", got)
		}
		d, code := p.check(t, "k_pro", "route:/search", -1)
		if code != 200 || d.Remaining != 4 || d.Policy != "pro" {
			t.Fatalf("/check after gRPC: %d %+v, want 4 remaining", code, d)
		}
		resp = rls(t, c, "edge", 0, desc("api_key", "k_pro", "path", "/search"))
		if got := resp.Statuses[0].LimitRemaining; got != 3 {
			t.Fatalf("remaining %d after /check, want 3", got)
		}
	})

	t.Run("hits_addend is the cost", func(t *testing.T) {
		resp := rls(t, c, "edge", 2, desc("api_key", "k_hits", "path", "/a"))
		if got := resp.Statuses[0].LimitRemaining; got != 1 {
			t.Errorf("request hits_addend 2: remaining %d, want 1", got)
		}
		d := desc("api_key", "k_hits2", "path", "/a")
		d.HitsAddend = wrapperspb.UInt64(3) // the descriptor's own overrides the request's
		resp = rls(t, c, "edge", 1, d)
		if got := resp.Statuses[0].LimitRemaining; got != 0 || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("descriptor hits_addend 3: %v, want OK with 0 remaining", resp)
		}
		// No hits_addend: the policy's cost for the scope (5 > burst 3: can never pass).
		resp = rls(t, c, "edge", 0, desc("api_key", "k_big", "path", "/big"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("cost above the burst: %v, want OVER_LIMIT", resp)
		}
		if got := p.metric(t, `limiter_envoy_descriptors_total{result="cost_exceeds_limit"}`); got != 1 {
			t.Errorf("cost_exceeds_limit counted %v, want 1", got)
		}
	})

	t.Run("several descriptors: the first rejection stops the request", func(t *testing.T) {
		// The global search budget (2) is spent by other callers.
		for i := 0; i < 2; i++ {
			resp := rls(t, c, "edge", 0, desc("generic_key", "global", "path", "/search"))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("global budget: %v", resp)
			}
		}
		// Per-IP first, global second: the IP spends, the global rejects.
		resp := rls(t, c, "edge", 0, desc("remote_address", "10.0.0.2"), desc("generic_key", "global", "path", "/search"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 ||
			resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%v", resp)
		}
		if h := headerMap(resp); h["ratelimit-limit"] != "2" || h["retry-after"] == "" {
			t.Errorf("headers report the rejecting descriptor: %v", h)
		}
		// An IP over its limit first: the global descriptor after it is
		// not evaluated and spends nothing.
		r2 := testenv.StartRedis(t)
		p2, addr2 := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "REDIS_ADDRS="+r2.Addr(), "LIMITER_STORE_TIMEOUT=2s")
		c2 := rlsv3.NewRateLimitServiceClient(dial(t, addr2))
		for i := 0; i < 3; i++ {
			rls(t, c2, "edge", 0, desc("remote_address", "10.0.0.3"))
		}
		resp = rls(t, c2, "edge", 0, desc("remote_address", "10.0.0.3"), desc("generic_key", "global", "path", "/search"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[1].Code != rlsv3.RateLimitResponse_UNKNOWN || resp.Statuses[1].CurrentLimit != nil {
			t.Fatalf("%v", resp)
		}
		if d, _ := p2.check(t, "global", "route:/search", 0); d.Remaining != 2 {
			t.Errorf("the global budget after a request rejected by its per-IP limit: %d left, want 2 (untouched)", d.Remaining)
		}
		if got := p2.metric(t, `limiter_envoy_descriptors_total{result="not_evaluated"}`); got != 1 {
			t.Errorf("not_evaluated counted %v, want 1", got)
		}
	})

	t.Run("dry run answers OK and counts the would-be rejection", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			resp := rls(t, c, "edge", 0, desc("api_key", "k_dry", "path", "/export"))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
				t.Fatalf("dry run request %d: %v", i, resp)
			}
			if h := headerMap(resp); len(h) != 0 {
				t.Errorf("a dry-run limit shows in the client's headers: %v", h)
			}
		}
		if got := p.metric(t, `limiter_envoy_descriptors_total{result="would_reject"}`); got != 1 {
			t.Errorf("would_reject counted %v, want 1", got)
		}
		if got := p.metric(t, `limiter_policy_decisions_total{outcome="would_reject",policy="export-trial"}`); got != 1 {
			t.Errorf("the per-policy would_reject counted %v, want 1", got)
		}
	})

	t.Run("the quota binds", func(t *testing.T) {
		// k_pro's quota is 100 a day; the bucket holds 6: the bucket binds.
		resp := rls(t, c, "edge", 0, desc("api_key", "k_pro", "path", "/q"))
		// 60 a minute is 1 a second: the smallest unit with a whole number.
		if cl := resp.Statuses[0].GetCurrentLimit(); cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetRequestsPerUnit() != 1 || cl.GetName() != "pro" {
			t.Errorf("current_limit %v, want the bucket's pro 1/SECOND", cl)
		}
	})

	t.Run("unknown domain and unmatched descriptors: OK, no limit", func(t *testing.T) {
		resp := rls(t, c, "nope", 0, desc("remote_address", "10.0.0.9"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
			resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("unknown domain: %v", resp)
		}
		resp = rls(t, c, "edge", 0, desc("user", "u1"), desc("remote_address", "10.0.0.10"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
			resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].LimitRemaining != 2 {
			t.Errorf("unmatched + matched: %v", resp)
		}
		if got := p.metric(t, `limiter_envoy_descriptors_total{result="unknown_domain"}`); got != 1 {
			t.Errorf("unknown_domain counted %v, want 1", got)
		}
		if got := p.metric(t, `limiter_envoy_descriptors_total{result="no_match"}`); got != 1 {
			t.Errorf("no_match counted %v, want 1", got)
		}
	})

	t.Run("invalid requests spend nothing", func(t *testing.T) {
		ctx := context.Background()
		_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge"})
		wantCode(t, err, codes.InvalidArgument, "at least one descriptor")
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "1")}})
		wantCode(t, err, codes.InvalidArgument, "domain is required")
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}})
		wantCode(t, err, codes.InvalidArgument, "descriptors[0]: a descriptor needs at least one entry")
		// A valid descriptor, then an oversized one: refused whole, the first not spent.
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", "10.0.0.20"), desc("api_key", strings.Repeat("k", 300), "path", "/")}})
		wantCode(t, err, codes.InvalidArgument, "descriptors[1]: mapping per-key-route makes a key of 300 bytes, at most 256")
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", "10.0.0.20"), desc("user", strings.Repeat("v", 5000))}})
		wantCode(t, err, codes.InvalidArgument, "descriptors[1]: entries[0]: a key or value is longer than 4096 bytes")
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("api_key", "k", "path", strings.Repeat("/p", 100))}})
		wantCode(t, err, codes.InvalidArgument, "makes a scope of 206 bytes, at most 128")
		neg := desc("remote_address", "10.0.0.20")
		neg.HitsAddend, neg.IsNegativeHits = wrapperspb.UInt64(1), true
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{neg}})
		wantCode(t, err, codes.InvalidArgument, "is_negative_hits")
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", strings.Repeat("x", 70<<10))}})
		wantCode(t, err, codes.ResourceExhausted, "larger than max")
		if d, _ := p.check(t, "ip:10.0.0.20", "edge", 0); d.Remaining != 3 {
			t.Errorf("ip:10.0.0.20 has %d left after refused requests, want 3 (nothing spent)", d.Remaining)
		}
	})

	t.Run("metrics per method", func(t *testing.T) {
		if got := p.metric(t, `limiter_grpc_requests_total{code="OK",method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}`); got < 10 {
			t.Errorf("OK calls counted %v", got)
		}
		if got := p.metric(t, `limiter_grpc_requests_total{code="InvalidArgument",method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}`); got != 7 {
			t.Errorf("InvalidArgument calls counted %v, want 7", got)
		}
		if got := p.metric(t, `limiter_grpc_request_duration_seconds_count{method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}`); got < 17 {
			t.Errorf("latency observations %v", got)
		}
	})
}

// TestEnvoyRLSAuth: with LIMITER_AUTH_TOKEN set, calls need the bearer
// token as metadata; the health service does not.
func TestEnvoyRLSAuth(t *testing.T) {
	_, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "LIMITER_AUTH_TOKEN=s3cret")
	conn := dial(t, addr)
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "1.2.3.4")}}
	_, err := c.ShouldRateLimit(context.Background(), req)
	wantCode(t, err, codes.Unauthenticated, "bearer token")
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer wrong")
	_, err = c.ShouldRateLimit(ctx, req)
	wantCode(t, err, codes.Unauthenticated, "bearer token")
	ctx = metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer s3cret")
	if resp, err := c.ShouldRateLimit(ctx, req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("with the token: %v %v", resp, err)
	}
	hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{
		Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v %v", hc, err)
	}
}

// TestEnvoyRLSDisabled: LIMITER_GRPC_ADDR set to empty turns the gRPC
// server off; /check still answers.
func TestEnvoyRLSDisabled(t *testing.T) {
	p := startLimiter(t, envoyrlstest.EdgePolicy, "LIMITER_GRPC_ADDR=")
	if _, code := p.check(t, "k", "s", 1); code != 200 {
		t.Fatalf("/check: %d", code)
	}
	waitFor(t, "the off line is logged", 5*time.Second, func() bool {
		return strings.Contains(p.logs.String(), "LIMITER_GRPC_ADDR is empty")
	})
}

// TestEnvoyRLSShutdownMidCall: SIGTERM while a ShouldRateLimit call is in
// flight (held there by a paused Redis) and a stream of callers keeps
// calling. The call in flight is answered in full (shared or degraded);
// every streamed call is either answered in full or refused with
// UNAVAILABLE, never cut; new connections are refused; the process exits 0.
func TestEnvoyRLSShutdownMidCall(t *testing.T) {
	r := testenv.StartRedis(t)
	p, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "REDIS_ADDRS="+r.Addr(),
		"LIMITER_STORE_TIMEOUT=10s", "LIMITER_SHUTDOWN_GRACE=10s")
	c := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	rls(t, c, "edge", 0, desc("remote_address", "10.1.0.1")) // warm: the script is loaded

	// A stream of callers on their own connection until the server goes away.
	var streamed, refused, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	sc := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := sc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", fmt.Sprintf("10.2.%d.%d", g, i%200))}})
				cancel()
				switch {
				case err == nil && len(resp.Statuses) == 1 && resp.Statuses[0].CurrentLimit != nil:
					streamed.Add(1)
				case status.Code(err) == codes.Unavailable:
					refused.Add(1)
					return
				default:
					t.Errorf("a call during shutdown: %v %v", resp, err)
					other.Add(1)
					return
				}
			}
		}(g)
	}
	waitFor(t, "the stream is flowing", 20*time.Second, func() bool { return streamed.Load() > 20 })

	r.Process().Signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			r.Process().Signal(syscall.SIGCONT)
		}
	}()
	type result struct {
		resp *rlsv3.RateLimitResponse
		err  error
	}
	inFlight := make(chan result, 1)
	go func() {
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.1.0.2")}})
		inFlight <- result{resp, err}
	}()
	waitFor(t, "the call is in flight", 20*time.Second, func() bool {
		return p.metric(t, `limiter_grpc_in_flight{method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}`) >= 1
	})
	select {
	case res := <-inFlight:
		// Redis paused holds a call for the client's 1 s read timeout (then
		// it is decided degraded); a machine slower than that lets it finish
		// before the signal. The rest of the test still holds.
		t.Logf("the held call finished before SIGTERM (slow machine): %v %v", res.resp, res.err)
		inFlight <- res
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// New connections are refused once the server has stopped listening.
	waitFor(t, "new calls are refused", 20*time.Second, func() bool {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.1.0.3")}})
		return status.Code(err) == codes.Unavailable
	})
	r.Process().Signal(syscall.SIGCONT)
	stopped = false
	res := <-inFlight
	if res.err != nil || res.resp.OverallCode != rlsv3.RateLimitResponse_OK || res.resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("the call in flight at SIGTERM: %v %v, want a full OK answer", res.resp, res.err)
	}
	select {
	case <-p.done:
	case <-time.After(testenv.Timeout(15 * time.Second)):
		t.Fatal("the limiter did not exit")
	}
	close(stop)
	wg.Wait()
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d, want 0\n%s", code, p.logs.String())
	}
	t.Logf("stream: %d answered, %d callers refused with UNAVAILABLE, %d other", streamed.Load(), refused.Load(), other.Load())
}

// TestEnvoyRLSCheckThenActRace is TestCheckThenActRace through the whole
// product: two limiter processes sharing one Redis, many concurrent gRPC
// callers on one descriptor. The atomic script admits exactly the burst
// (the rate is 1 a day: nothing refills during the test).
func TestEnvoyRLSCheckThenActRace(t *testing.T) {
	r := testenv.StartRedis(t)
	const pol = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: day, burst: 40 }
domains:
  race:
    descriptors:
      - { match: [k], key: "{k}", scope: "s" }
`
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_STORE_TIMEOUT=5s", "LIMITER_EXPECTED_INSTANCES=2"}
	_, a1 := startEnvoyLimiter(t, pol, env...)
	_, a2 := startEnvoyLimiter(t, pol, env...)
	clients := []rlsv3.RateLimitServiceClient{
		rlsv3.NewRateLimitServiceClient(dial(t, a1)), rlsv3.NewRateLimitServiceClient(dial(t, a2)),
		rlsv3.NewRateLimitServiceClient(dial(t, a1)), rlsv3.NewRateLimitServiceClient(dial(t, a2)),
	}
	const goroutines, each = 32, 10
	var admitted, rejected atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(c rlsv3.RateLimitServiceClient) {
			defer wg.Done()
			<-start
			for i := 0; i < each; i++ {
				resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "race",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "hot")}})
				switch {
				case err != nil:
					t.Error(err)
					return
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					admitted.Add(1)
				default:
					rejected.Add(1)
				}
			}
		}(clients[g%len(clients)])
	}
	close(start)
	wg.Wait()
	t.Logf("%d admitted, %d rejected of %d through two limiters", admitted.Load(), rejected.Load(), goroutines*each)
	if admitted.Load() != 40 {
		t.Fatalf("admitted %d, want exactly the burst, 40", admitted.Load())
	}
}

// TestEnvoyRLSReloadAndDegraded: a domain added to the policy file is
// served after the reload with no restart; with Redis gone, descriptors are
// decided by the tightened local limit (degraded), as /check's are.
func TestEnvoyRLSReloadAndDegraded(t *testing.T) {
	r := testenv.StartRedis(t)
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(envoyrlstest.EdgePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "POLICY_FILE="+file, "REDIS_ADDRS="+r.Addr(), "LIMITER_EXPECTED_INSTANCES=3")
	c := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	if resp := rls(t, c, "partners", 0, desc("partner", "acme")); resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("an unknown domain was limited: %v", resp)
	}
	added := envoyrlstest.EdgePolicy + `
  partners:
    descriptors:
      - { match: [partner], key: "partner:{partner}", scope: "partners" }
`
	if err := os.WriteFile(file, []byte(added), 0o644); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, "the new domain is served", func() bool {
		return rls(t, c, "partners", 0, desc("partner", "acme")).Statuses[0].CurrentLimit != nil
	})

	r.Process().Kill()
	// Tightened: burst 3 ÷ 3 instances = 1 per instance while Redis is gone.
	resp := rls(t, c, "partners", 0, desc("partner", "fresh"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].GetCurrentLimit().GetName() != "free" {
		t.Fatalf("first degraded decision: %v", resp)
	}
	resp = rls(t, c, "partners", 0, desc("partner", "fresh"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || headerMap(resp)["ratelimit-limit"] != "1" {
		t.Fatalf("second degraded decision: %v, want OVER_LIMIT at the tightened burst 1", resp)
	}
	if got := p.metric(t, `limiter_decisions_total{result="rejected",source="degraded"}`); got < 1 {
		t.Errorf("degraded rejections counted %v", got)
	}
}
