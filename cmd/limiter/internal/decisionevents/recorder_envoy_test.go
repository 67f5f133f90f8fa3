package decisionevents

import (
	"context"
	"sync"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var desc = testenv.Descriptor // testkit/testenv

type memSink struct {
	mu  sync.Mutex
	evs []metering.Event
}

func (s *memSink) Emit(ev metering.Event) { s.mu.Lock(); s.evs = append(s.evs, ev); s.mu.Unlock() }

// TestEnvoyDecisionEventsCarryTheDomain: one decision event per decided
// descriptor, with the domain, through the limiter's own recorder and the
// event encoding; descriptors that were not decided (no match, after a
// rejection) make none, and /check's events have no domain.
func TestEnvoyDecisionEventsCarryTheDomain(t *testing.T) {
	pol, err := policy.Parse([]byte(envoyrlstest.EdgePolicy))
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	lim, err := enforcement.New(enforcement.Config{
		Authority: enforcement.NewMemoryAuthority(nil, 1000),
		Policy:    pol,
		Recorder:  &Recorder{sink: sink, ids: metering.NewIDs(), instance: "i1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := envoyrls.New(lim, nil)
	for i := 0; i < 4; i++ { // the 4th: the per-IP descriptor rejects, the route one is not evaluated
		_, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", "10.9.9.9"), desc("user", "nobody"), desc("api_key", "k", "path", "/x")}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lim.Check(context.Background(), enforcement.Request{Key: "k", Scope: "route:/x"}); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.evs) != 3*2+1+1 {
		t.Fatalf("%d events, want 8 (3 requests × 2 decided descriptors, the 4th request's rejection, /check)", len(sink.evs))
	}
	for i, ev := range sink.evs {
		b, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		back, err := metering.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		want := "edge"
		if i == len(sink.evs)-1 {
			want = ""
		}
		if back.Domain != want {
			t.Errorf("event %d (%s %s): domain %q, want %q: %s", i, back.Key, back.Scope, back.Domain, want, b)
		}
	}
	if last := sink.evs[len(sink.evs)-2]; last.Key != "ip:10.9.9.9" || last.Allowed {
		t.Errorf("the 4th request's event: %+v, want the per-IP rejection", last)
	}
}
