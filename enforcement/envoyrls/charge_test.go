package envoyrls_test

import (
	"context"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/policy"
)

// tokenPolicy: 1000 tokens, refilling 1000 an hour (nothing refills
// during the test), for the descriptor [{user, <id>}] of domain "ai".
const tokenPolicy = `
version: 1
default_tier: llm
tiers:
  llm: { rate: 1000, period: hour, burst: 1000 }
domains:
  ai:
    descriptors:
      - { match: [user], key: "user:{user}", scope: "tokens" }
`

// rlsClient serves the service over a real gRPC server on loopback and
// returns a client of it, as Envoy's rate limit filter connects.
func rlsClient(t *testing.T, svc *envoyrls.Service) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// envoyCall is one RateLimitRequest as Envoy's rate limit filter sends it
// for the route's rate_limits entry: at request time with hits_addend 0
// (the check), or when the stream is done with the charge entry and
// hits_addend taken from the metadata the response left (the tokens used).
func envoyCall(t *testing.T, c rlsv3.RateLimitServiceClient, user string, hits uint64, done bool) *rlsv3.RateLimitResponse {
	t.Helper()
	desc := &ratelimitv3.RateLimitDescriptor{
		Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
		HitsAddend: wrapperspb.UInt64(hits),
	}
	if done {
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: envoyrls.ChargeEntryKey, Value: "stream_done"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestEnvoyTokenLimitCheckThenStreamDoneCharge(t *testing.T) {
	p, err := policy.Parse([]byte(tokenPolicy))
	if err != nil {
		t.Fatal(err)
	}
	mem := enforcement.NewMemoryAuthority(nil, 1<<10)
	lim, err := enforcement.New(enforcement.Config{Authority: mem, Reservations: mem, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	c := counter{}
	cl := rlsClient(t, envoyrls.New(lim, c))

	ok := rlsv3.RateLimitResponse_OK
	over := rlsv3.RateLimitResponse_OVER_LIMIT
	// Request 1 passes the check; its completion used 700 tokens.
	if r := envoyCall(t, cl, "u1", 0, false); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("check of a full bucket: %v", r)
	}
	if r := envoyCall(t, cl, "u1", 700, true); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 300 {
		t.Fatalf("charge 700: %v", r)
	}
	// Request 2 passes (300 left) and uses 800: more than is left, charged
	// whole, so the bucket is 500 in debt.
	if r := envoyCall(t, cl, "u1", 0, false); r.OverallCode != ok {
		t.Fatalf("check with 300 left: %v", r)
	}
	if r := envoyCall(t, cl, "u1", 800, true); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("charge 800 of 300: %v", r)
	}
	// In debt the request-time check is over the limit, and the retry
	// time pays the debt off and refills the one token the check passes
	// on: 501 tokens at 1000 an hour, 1803.6 s.
	r := envoyCall(t, cl, "u1", 0, false)
	if r.OverallCode != over {
		t.Fatalf("check in debt: %v", r)
	}
	var retry string
	for _, h := range r.ResponseHeadersToAdd {
		if h.Key == "retry-after" {
			retry = h.Value
		}
	}
	if retry != "1804" {
		t.Fatalf("retry-after in debt = %q, want 1804 (s): %v", retry, r.ResponseHeadersToAdd)
	}
	// Another user is unaffected; an empty bucket (not in debt) is over
	// the limit at hits_addend 0 too.
	envoyCall(t, cl, "u2", 1000, true)
	if r := envoyCall(t, cl, "u2", 0, false); r.OverallCode != over {
		t.Fatalf("check of an empty bucket: %v", r)
	}
	if r := envoyCall(t, cl, "u3", 0, false); r.OverallCode != ok {
		t.Fatalf("check of another user: %v", r)
	}
	if c[envoyrls.ResultCharged] != 3 || c[envoyrls.ResultOverLimit] != 2 {
		t.Fatalf("results: %v", c)
	}

	// A charge without a cost, or with nothing but the marker, is refused.
	for _, desc := range []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u4"}, {Key: envoyrls.ChargeEntryKey, Value: "x"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: envoyrls.ChargeEntryKey, Value: "x"}}, HitsAddend: wrapperspb.UInt64(5)},
	} {
		_, err := cl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", desc, err)
		}
	}
}
