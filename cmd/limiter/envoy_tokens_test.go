package main

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// envoyTokenPolicy is docs/envoy.md's token limit: the domain "ai" maps
// [user] to key user:{user}, scope tokens. Tier llm refills 1000 tokens an
// hour (a fraction of a token a second: a debt stays a debt for the
// test's length, however slow the machine); tier fast, for user:fast,
// refills 100 a second, so that its debt is paid while the test waits.
const envoyTokenPolicy = `
version: 1
default_tier: llm
tiers:
  llm:  { rate: 1000, period: hour, burst: 1000 }
  fast: { rate: 100, burst: 100 }
keys: { "user:fast": fast }
domains:
  ai:
    descriptors:
      - { match: [user], key: "user:{user}", scope: "tokens" }
`

// llmPerSecond is tier llm's refill, tokens a second.
const llmPerSecond = 1000.0 / 3600

// tokenCall is one RateLimitRequest exactly as Envoy's rate limit filter
// sends it for docs/envoy.md's route: at request time the descriptor
// [{user, u}] with hits_addend 0 (its rate_limits entry's
// `hits_addend: {number: 0}`); when the stream is done (done) the same
// entry, then the generic_key entry ratewarden.charge, with hits_addend
// the tokens the response's metadata reported. The request's own
// hits_addend is 0, as Envoy sends it.
func tokenCall(t *testing.T, c rlsv3.RateLimitServiceClient, user string, hits uint64, done bool) *rlsv3.RateLimitResponse {
	t.Helper()
	d := desc("user", user)
	if done {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "ratewarden.charge", Value: "stream_done"})
	}
	d.HitsAddend = wrapperspb.UInt64(hits)
	resp := rls(t, c, "ai", 0, d)
	if len(resp.Statuses) != 1 {
		t.Fatalf("%d statuses for one descriptor: %v", len(resp.Statuses), resp)
	}
	return resp
}

// refill is the most tier llm can have refilled since start: a bound for
// the answers, measured, so that a slow machine only widens it.
func refill(start time.Time) int64 {
	return int64(math.Ceil(time.Since(start).Seconds() * llmPerSecond))
}

// headerSeconds is a whole-seconds header of resp (retry-after, ...).
func headerSeconds(t *testing.T, resp *rlsv3.RateLimitResponse, name string) int64 {
	t.Helper()
	v, ok := headerMap(resp)[name]
	if !ok {
		t.Fatalf("no %s header: %v", name, resp.ResponseHeadersToAdd)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q: %v", name, v, err)
	}
	return n
}

// TestEnvoyTokenLimitOverRedis: the token-limit pattern of docs/envoy.md
// driven as Envoy drives it (a gRPC client sending the request-time check
// and the stream-done charge) against limiter processes on one
// redis-server. The debt is asserted by what the limiter answers; the
// times it reports are bounded by the refill the test measured, and the
// one wait (a debt paid off) has only a lower bound.
func TestEnvoyTokenLimitOverRedis(t *testing.T) {
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, metering.DefaultTopic, 1)
	env := []string{"REDIS_ADDRS=" + r.Addr(), "KAFKA_BROKERS=" + k.Addr(), "LIMITER_STORE_TIMEOUT=2s"}
	a, addrA := startEnvoyLimiter(t, envoyTokenPolicy, env...)
	b, addrB := startEnvoyLimiter(t, envoyTokenPolicy, env...)
	ca := rlsv3.NewRateLimitServiceClient(dial(t, addrA))
	cb := rlsv3.NewRateLimitServiceClient(dial(t, addrB))
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	t.Run("a charge beyond what is left puts the bucket in debt", func(t *testing.T) {
		start := time.Now()
		resp := tokenCall(t, ca, "u1", 0, false)
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.Code != ok || st.LimitRemaining != 1000 {
			t.Fatalf("check of a full bucket: %v", resp)
		}
		if cl := st.GetCurrentLimit(); cl.GetName() != "llm" || cl.GetRequestsPerUnit() != 1000 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("current_limit %v, want llm 1000/HOUR", cl)
		}
		// The first completion used 700 tokens.
		resp = tokenCall(t, ca, "u1", 700, true)
		if resp.OverallCode != ok || resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 300 {
			t.Fatalf("charge 700 of 1000: %v", resp)
		}
		// 300 left: the second request passes, and its completion uses
		// 800, charged whole: 500 in debt.
		resp = tokenCall(t, ca, "u1", 0, false)
		if got := int64(resp.Statuses[0].LimitRemaining); resp.OverallCode != ok || got < 300 || got > 300+refill(start) {
			t.Fatalf("check with 300 left: %v", resp)
		}
		charged := time.Now()
		resp = tokenCall(t, ca, "u1", 800, true)
		if resp.OverallCode != ok || resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("charge 800 of 300: %v, want OK with 0 remaining", resp)
		}

		// In debt the request-time check is over the limit, on either
		// process, and the times it reports count the debt: about 500
		// tokens and the one the check passes on, at 1000 an hour (1804 s), 1500
		// before the bucket is full (5400 s).
		for name, c := range map[string]rlsv3.RateLimitServiceClient{"the charging process": ca, "the other process": cb} {
			resp := tokenCall(t, c, "u1", 0, false)
			st := resp.Statuses[0]
			if resp.OverallCode != over || st.Code != over || st.LimitRemaining != 0 {
				t.Fatalf("%s: check in debt: %v, want OVER_LIMIT with 0 remaining", name, resp)
			}
			debtLow := 500 - refill(start) // what refilled since before the charges
			retry := headerSeconds(t, resp, "retry-after")
			if lo, hi := int64(float64(debtLow)/llmPerSecond)-1, int64(math.Ceil(501/llmPerSecond)); retry < lo || retry > hi {
				t.Errorf("%s: retry-after %d s, want the debt's %d..%d s", name, retry, lo, hi)
			}
			reset := st.GetDurationUntilReset().AsDuration()
			if lo, hi := time.Duration(float64(1000+debtLow)/llmPerSecond)*time.Second-time.Second, 5400*time.Second; reset < lo || reset > hi {
				t.Errorf("%s: duration_until_reset %v, want %v..%v (burst and debt)", name, reset, lo, hi)
			}
			t.Logf("%s: in debt: retry-after %d s, duration_until_reset %v", name, retry, reset)
			if got := headerSeconds(t, resp, "x-ratelimit-reset"); got < int64(reset/time.Second) || got > 5400 {
				t.Errorf("%s: x-ratelimit-reset %d, duration_until_reset %v", name, got, reset)
			}
		}
		// The same bucket through /check: a cost 0 is refused in debt.
		if d, code := b.check(t, "user:u1", "tokens", 0); code != 200 || d.Allowed || d.RetryAfterMs < int64(float64(500-refill(charged)-1)/llmPerSecond)*1000 {
			t.Errorf("/check cost 0 in debt: %d %+v", code, d)
		}
		// Another user's bucket is untouched.
		if resp := tokenCall(t, cb, "u2", 0, false); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 1000 {
			t.Errorf("another user: %v", resp)
		}
	})

	t.Run("a charge on one process, the check on the other", func(t *testing.T) {
		// B has decided for u3 (its local tier holds the bucket) before A
		// charges it into debt: B must still see the debt.
		if resp := tokenCall(t, cb, "u3", 0, false); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 1000 {
			t.Fatalf("check of a full bucket: %v", resp)
		}
		if resp := tokenCall(t, ca, "u3", 1200, true); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("charge 1200 of 1000: %v", resp)
		}
		for i := 0; i < 3; i++ {
			if resp := tokenCall(t, cb, "u3", 0, false); resp.OverallCode != over || resp.Statuses[0].Code != over {
				t.Fatalf("check %d on the other process after a charge into debt: %v, want OVER_LIMIT", i, resp)
			}
		}
		// A charge through B adds to the debt A sees.
		tokenCall(t, cb, "u3", 300, true)
		resp := tokenCall(t, ca, "u3", 0, false)
		if resp.OverallCode != over || headerSeconds(t, resp, "retry-after") < int64(450/llmPerSecond) {
			t.Fatalf("check after charges on both processes (500 in debt): %v", resp)
		}
	})

	t.Run("the debt is paid with time", func(t *testing.T) {
		// user:fast: 100 tokens, 100 a second. A 300-token completion
		// leaves 200 in debt: the check cannot pass before the debt and
		// one token have refilled, 2.01 s after the charge.
		start := time.Now()
		if resp := tokenCall(t, ca, "fast", 300, true); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("charge 300 of 100: %v", resp)
		}
		overs := 0
		var passed *rlsv3.RateLimitResponse
		eventually(t, "a check to pass once the debt is paid", func() bool {
			resp := tokenCall(t, cb, "fast", 0, false)
			if resp.OverallCode == over {
				overs++
				if retry := headerSeconds(t, resp, "retry-after"); retry < 1 || retry > 3 {
					t.Fatalf("retry-after %d s in a debt of at most 200 at 100/s", retry)
				}
				time.Sleep(50 * time.Millisecond)
				return false
			}
			passed = resp
			return true
		})
		// A lower bound only: a slow machine just waits longer.
		if waited := time.Since(start); waited < 1900*time.Millisecond {
			t.Fatalf("a check passed %v after a charge of 200 tokens beyond the bucket at 100/s", waited)
		}
		if passed.Statuses[0].Code != ok || passed.Statuses[0].LimitRemaining < 1 {
			t.Fatalf("check after the debt is paid: %v", passed)
		}
		t.Logf("%d checks over the limit before the debt was paid", overs)
	})

	t.Run("metrics and events count the actual tokens", func(t *testing.T) {
		var charged float64
		for _, p := range []*limiterProc{a, b} {
			charged += p.metric(t, `limiter_envoy_descriptors_total{result="charged"}`)
		}
		if charged != 5 {
			t.Errorf("limiter_envoy_descriptors_total{result=\"charged\"} = %v over both processes, want 5", charged)
		}
		// Every charge is an event of kind charge, of the domain it came
		// through, whose actual is the tokens Envoy reported; the checks
		// spent nothing.
		want := map[string]uint64{"user:u1": 1500, "user:u3": 1500, "user:fast": 300}
		var actual map[string]uint64
		var charges int
		eventually(t, "the charge events in Kafka", func() bool {
			actual, charges = map[string]uint64{}, 0
			for _, ev := range topicEvents(t, k.Addr(), metering.DefaultTopic) {
				switch {
				case ev.Kind == metering.KindCharge:
					actual[ev.Key] += ev.Actual
					charges++
					if ev.Cost != 0 || ev.Estimate != 0 || ev.Scope != "tokens" || ev.Domain != "ai" {
						t.Fatalf("charge event %+v: want cost 0, estimate 0, scope tokens, domain ai", ev)
					}
				case ev.IsDecision() && ev.Scope == "tokens" && ev.Cost != 0:
					t.Fatalf("a hits_addend 0 check spent: %+v", ev)
				}
			}
			if charges < 5 {
				time.Sleep(100 * time.Millisecond)
			}
			return charges >= 5
		})
		if charges != 5 {
			t.Errorf("%d charge events, want 5", charges)
		}
		for key, n := range want {
			if actual[key] != n {
				t.Errorf("charge events of %s: actual %d, want %d (all: %v)", key, actual[key], n, actual)
			}
		}
	})
}

// topicEvents reads every event partition 0 of topic holds.
func topicEvents(t *testing.T, addr, topic string) []metering.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, 0)
	if err != nil {
		t.Fatalf("dial the leader: %v", err)
	}
	end, err := conn.ReadLastOffset()
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out []metering.Event
	if end == 0 {
		return out
	}
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer rd.Close()
	for {
		m, err := rd.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read up to %d: %v", end, err)
		}
		ev, err := metering.Decode(m.Value)
		if err != nil {
			t.Fatalf("offset %d: %v", m.Offset, err)
		}
		out = append(out, ev)
		if m.Offset >= end-1 {
			return out
		}
	}
}
