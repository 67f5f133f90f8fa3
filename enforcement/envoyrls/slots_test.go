package envoyrls_test

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// slotsPolicy: two slots per key of domain "d" (the descriptor [{k,
// <key>}]), sheddable traffic one of them; key "r" has a rate of one an
// hour and no slots.
const slotsPolicy = `
version: 1
default_tier: slots
priorities: { critical: 1, default: 1, sheddable: 0.5 }
tiers:
  slots: { concurrency: 2 }
  tight: { rate: 1, period: hour, burst: 1 }
keys: { r: tight }
domains:
  d:
    descriptors:
      - { match: [k], key: "{k}", scope: "s" }
`

// slotsDoor is the door with slots on the Redis at addr under prefix, as
// the limiter wires it (the Gate in front of the limiter, its leases
// lasting doorTTL where the Gate's last an hour), behind a real gRPC
// server.
func slotsDoor(t *testing.T, addr, prefix string, doorTTL time.Duration) rlsv3.RateLimitServiceClient {
	t.Helper()
	p, err := policy.Parse([]byte(slotsPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, prefix), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	g, err := slots.NewGate(slots.Config{
		Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, prefix),
		TTL: time.Hour, Timeout: testenv.Timeout(5 * time.Second), // never degraded on a slow machine
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := envoyrls.New(lim, nil)
	svc.SetSlots(g.For(doorTTL))
	return rlsClient(t, svc)
}

// slotDesc is the request-time descriptor of key k, with a priority
// entry when priority is not empty.
func slotDesc(k, priority string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: k}}}
	if priority != "" {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: envoyrls.PriorityEntryKey, Value: priority})
	}
	return d
}

// ask sends one request-time call, as Envoy's filter does.
func ask(t *testing.T, c rlsv3.RateLimitServiceClient, ds ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(10*time.Second))
	defer cancel()
	return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: ds})
}

// take asks for key k's slot and returns the lease the answer's dynamic
// metadata carries ("" when over the limit), checking that the two agree.
func take(t *testing.T, c rlsv3.RateLimitServiceClient, k, priority string) (lease string, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	resp, err := ask(t, c, slotDesc(k, priority))
	if err != nil {
		t.Fatalf("take %s: %v", k, err)
	}
	lease = metaOf(resp, envoyrls.LeaseMetadataKey)
	if (resp.OverallCode == rlsv3.RateLimitResponse_OK) != (lease != "") {
		t.Fatalf("take %s: %v with lease %q", k, resp.OverallCode, lease)
	}
	return lease, resp
}

func metaOf(resp *rlsv3.RateLimitResponse, field string) string {
	return resp.GetDynamicMetadata().GetFields()[field].GetStringValue()
}

// streamDone sends the stream-done call of Envoy's configuration in
// docs/concurrency.md: the release entry, its value the lease metadata
// read back.
func streamDone(t *testing.T, c rlsv3.RateLimitServiceClient, leases string) error {
	t.Helper()
	resp, err := ask(t, c, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: envoyrls.ReleaseEntryKey, Value: leases}}})
	if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("release %q: %v", leases, resp.OverallCode)
	}
	return err
}

// TestEnvoyDoorTakesAndGivesBackSlots: through a real gRPC client on a
// real Redis, a request takes a slot and names it in its dynamic
// metadata; the stream-done call gives it back; a release sent twice, a
// forged lease id or one of another key frees nothing another request
// holds; a call over the limit in a later descriptor gives back the slot
// an earlier one took; the priority entry sheds the lower class.
func TestEnvoyDoorTakesAndGivesBackSlots(t *testing.T) {
	r := testenv.StartRedis(t)
	c := slotsDoor(t, r.Addr(), "door", time.Minute)
	over := rlsv3.RateLimitResponse_OVER_LIMIT
	full := func(k, priority, reason string) {
		t.Helper()
		lease, resp := take(t, c, k, priority)
		if lease != "" || resp.OverallCode != over || metaOf(resp, envoyrls.ReasonMetadataKey) != reason {
			t.Fatalf("%s (%s) should be refused for %s: %v", k, priority, reason, resp)
		}
	}

	l1, resp := take(t, c, "a", "")
	if l1 == "" || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 || resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("first slot: %v", resp)
	}
	l2, _ := take(t, c, "a", "")
	if l2 == "" || l2 == l1 {
		t.Fatalf("second slot: %q after %q", l2, l1)
	}
	full("a", "", enforcement.ReasonConcurrency)
	retry := ""
	_, resp = take(t, c, "a", "")
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "retry-after" {
			retry = h.Value
		}
	}
	if retry == "" || retry == "0" {
		t.Fatalf("a refusal without retry-after: %v", resp.ResponseHeadersToAdd)
	}

	// The stream ends: its slot is given back and taken by the next.
	if err := streamDone(t, c, l1); err != nil {
		t.Fatal(err)
	}
	l3, _ := take(t, c, "a", "")
	if l3 == "" {
		t.Fatal("the slot released at stream end was not given out again")
	}
	full("a", "", enforcement.ReasonConcurrency)

	// The same release again (Envoy retrying, a duplicate) frees nothing:
	// l1's slot is l3's now.
	if err := streamDone(t, c, l1); err != nil {
		t.Fatal(err)
	}
	full("a", "", enforcement.ReasonConcurrency)
	// A forged lease of the same key and scope, and a lease of another
	// key, free nothing either; what is not a lease id is refused.
	forged := slots.LeaseID(slots.Slot{Key: "a", Scope: "s", Member: slots.NewMember()})
	other, _ := take(t, c, "b", "")
	if err := streamDone(t, c, forged+","+other); err != nil {
		t.Fatal(err)
	}
	full("a", "", enforcement.ReasonConcurrency)
	if err := streamDone(t, c, "not-a-lease"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a made-up id: %v", err)
	}
	full("a", "", enforcement.ReasonConcurrency)

	// Both of a's holders end; the sheddable class gets one slot of two,
	// critical the other; an undefined class is refused.
	if err := streamDone(t, c, l2+","+l3); err != nil {
		t.Fatal(err)
	}
	if l, _ := take(t, c, "a", "sheddable"); l == "" {
		t.Fatal("sheddable refused with both slots free")
	}
	full("a", "sheddable", enforcement.ReasonShed)
	if l, _ := take(t, c, "a", "critical"); l == "" {
		t.Fatal("critical refused with a slot free")
	}
	if _, err := ask(t, c, slotDesc("a", "bulk")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an undefined class: %v", err)
	}

	// Two slots in one call: both leases in the metadata, both given back
	// by one stream-done call.
	resp, err := ask(t, c, slotDesc("m", ""), slotDesc("n", ""))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("two slots: %v, %v", resp, err)
	}
	both := metaOf(resp, envoyrls.LeaseMetadataKey)
	if strings.Count(both, ",") != 1 {
		t.Fatalf("two slots, metadata %q", both)
	}
	take(t, c, "m", "")
	full("m", "", enforcement.ReasonConcurrency)
	if err := streamDone(t, c, both); err != nil {
		t.Fatal(err)
	}
	if l, _ := take(t, c, "m", ""); l == "" {
		t.Fatal("m's slot not given back by the two-lease release")
	}
	take(t, c, "n", "")
	if l, _ := take(t, c, "n", ""); l == "" {
		t.Fatal("n's slot not given back by the two-lease release")
	}

	// A call whose later descriptor is over its rate does not run: the
	// slot its first descriptor took is given back at once.
	if resp, err := ask(t, c, slotDesc("p", ""), slotDesc("r", "")); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("slot and rate: %v, %v", resp, err)
	}
	for range 3 { // each refused call took p's second slot and gave it back
		if resp, err := ask(t, c, slotDesc("p", ""), slotDesc("r", "")); err != nil || resp.OverallCode != over || resp.GetDynamicMetadata() != nil {
			t.Fatalf("slot then over the rate: %v, %v", resp, err)
		}
	}
	if l, _ := take(t, c, "p", ""); l == "" {
		t.Fatal("a call over the limit kept the slot it took")
	}
}

// TestEnvoyDoorSlotOfALostStreamReturns: a stream whose stream-done call
// never comes (Envoy killed) keeps its slot until its lease ends, which
// nobody renews, and not longer: the slot is given out again after the
// door's lease time (not the Gate's hour), never before.
func TestEnvoyDoorSlotOfALostStreamReturns(t *testing.T) {
	r := testenv.StartRedis(t)
	const ttl = slots.MinTTL
	c := slotsDoor(t, r.Addr(), "lost", ttl)
	start := time.Now() // before the store's clock starts the leases
	for range 2 {
		if l, _ := take(t, c, "a", ""); l == "" {
			t.Fatal("a slot refused with slots free")
		}
	}
	testenv.WaitFor(t, testenv.Timeout(10*time.Second)+ttl, "a slot of a lost stream given out again", func() bool {
		l, _ := take(t, c, "a", "")
		if l != "" && time.Since(start) < ttl {
			t.Fatalf("a slot given out %v after it was taken, before its lease of %v ended", time.Since(start), ttl)
		}
		return l != ""
	})
}
