package envoyrls_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestEnvoyDoorShedsOnARate: through the door, on a rate alone (burst 4,
// one token an hour), the priority entry sheds the sheddable class (share
// 0.5) at its floor: OVER_LIMIT with the reason shed in the dynamic
// metadata, while critical spends the last tokens and is then refused
// for the rate, with no reason.
func TestEnvoyDoorShedsOnARate(t *testing.T) {
	r := testenv.StartRedis(t)
	p, err := policy.Parse([]byte(`
version: 1
default_tier: api
priorities: { critical: 1, default: 1, sheddable: 0.5 }
tiers:
  api: { rate: 1, period: hour, burst: 4 }
domains:
  d:
    descriptors:
      - { match: [k], key: "{k}", scope: "s" }
`))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "doorrate"), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	g, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, "doorrate"),
		TTL: time.Hour, Timeout: testenv.Timeout(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	svc := envoyrls.New(lim, nil)
	svc.SetSlots(g.For(0))
	c := rlsClient(t, svc)
	call := func(class string) (rlsv3.RateLimitResponse_Code, string) {
		resp, err := ask(t, c, slotDesc("acct", class))
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode, metaOf(resp, envoyrls.ReasonMetadataKey)
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i := range 2 {
		if code, _ := call("sheddable"); code != ok {
			t.Fatalf("sheddable %d within its share: %v", i+1, code)
		}
	}
	if code, reason := call("sheddable"); code != over || reason != enforcement.ReasonShed {
		t.Fatalf("sheddable at its floor: %v, reason %q; want OVER_LIMIT, shed", code, reason)
	}
	for i := range 2 {
		if code, _ := call("critical"); code != ok {
			t.Fatalf("critical %d below the floor: %v", i+1, code)
		}
	}
	if code, reason := call("critical"); code != over || reason != "" {
		t.Fatalf("critical on the empty bucket: %v, reason %q; want OVER_LIMIT for the rate", code, reason)
	}
}
