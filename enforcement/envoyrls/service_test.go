package envoyrls_test

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
)

const unitPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 2 }
  big:  { rate: 3600, period: hour, burst: 10, quota: { limit: 4, period: day } }
rules:
  - name: trial
    scope: "trial"
    dry_run: true
keys: { q: big }
domains:
  d:
    descriptors:
      - { match: [k], key: "{k}", scope: "s" }
      - { match: [k, s], key: "{k}", scope: "{s}" }
`

type counter map[envoyrls.Result]int

func (c counter) Descriptor(_ string, r envoyrls.Result) { c[r]++ }

func call(t *testing.T, svc *envoyrls.Service, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func d(kv ...string) *ratelimitv3.RateLimitDescriptor {
	out := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestMultiDescriptorStopsAtTheFirstRejection(t *testing.T) {
	lim := envoyrlstest.Limiter(t, unitPolicy)
	c := counter{}
	svc := envoyrls.New(lim, c)
	call(t, svc, d("k", "a"))
	call(t, svc, d("k", "a")) // a is spent (burst 2)
	resp := call(t, svc, d("k", "b"), d("k", "a"), d("k", "c"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("%v", resp)
	}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_UNKNOWN}
	for i, st := range resp.Statuses {
		if st.Code != want[i] {
			t.Errorf("statuses[%d] = %v, want %v", i, st.Code, want[i])
		}
	}
	// b spent one token (it came first); c spent nothing.
	for key, left := range map[string]int64{"b": 1, "c": 2} {
		dd, err := lim.Check(context.Background(), enforcement.Request{Key: key, Scope: "s", Cost: 0, HasCost: true})
		if err != nil || dd.Remaining != left {
			t.Errorf("%s: %d left, want %d (%v)", key, dd.Remaining, left, err)
		}
	}
	if c[envoyrls.ResultOK] != 3 || c[envoyrls.ResultOverLimit] != 1 || c[envoyrls.ResultNotEvaluated] != 1 {
		t.Errorf("counted %v", c)
	}
}

func TestDryRunAnswersOK(t *testing.T) {
	lim := envoyrlstest.Limiter(t, unitPolicy)
	c := counter{}
	svc := envoyrls.New(lim, c)
	for i := 0; i < 3; i++ {
		resp := call(t, svc, d("k", "x", "s", "trial"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("dry run %d: %v", i, resp)
		}
	}
	if c[envoyrls.ResultWouldReject] != 1 || c[envoyrls.ResultOK] != 2 {
		t.Errorf("counted %v", c)
	}
}

func TestQuotaBindsInCurrentLimit(t *testing.T) {
	lim := envoyrlstest.Limiter(t, unitPolicy)
	svc := envoyrls.New(lim, nil)
	resp := call(t, svc, d("k", "q"))
	cl := resp.Statuses[0].CurrentLimit
	// 4 a day left 3; the bucket has 9: the quota binds.
	if cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || cl.GetRequestsPerUnit() != 4 || resp.Statuses[0].LimitRemaining != 3 {
		t.Errorf("%v, want the quota 4/DAY with 3 left", resp.Statuses[0])
	}
	if r := resp.Statuses[0].DurationUntilReset.AsDuration(); r <= 0 || r > 24*time.Hour {
		t.Errorf("duration_until_reset %v, want until the end of the UTC day", r)
	}
	resp = call(t, svc, d("k", "x")) // 1 an hour, burst 2
	if cl := resp.Statuses[0].CurrentLimit; cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || cl.GetRequestsPerUnit() != 1 || cl.GetName() != "free" {
		t.Errorf("current_limit %v, want free 1/HOUR", cl)
	}
}

// Every descriptor of a request gets its own current_limit, remaining and
// duration_until_reset (the answer's messages are allocated together: none
// may be shared between descriptors), the same as the descriptor alone
// would get.
func TestSeveralDescriptorsEachTheirOwnStatus(t *testing.T) {
	svc := envoyrls.New(envoyrlstest.Limiter(t, unitPolicy), nil)
	resp := call(t, svc, d("k", "x"), d("k", "q"), d("k", "y"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 3 {
		t.Fatalf("%v", resp)
	}
	type want struct {
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		per  uint32
		left uint32
		max  time.Duration
	}
	for i, w := range []want{
		{rlsv3.RateLimitResponse_RateLimit_HOUR, 1, 1, time.Hour},     // free: 1 an hour, burst 2
		{rlsv3.RateLimitResponse_RateLimit_DAY, 4, 3, 24 * time.Hour}, // big: the quota binds
		{rlsv3.RateLimitResponse_RateLimit_HOUR, 1, 1, time.Hour},
	} {
		st := resp.Statuses[i]
		if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit.GetUnit() != w.unit || st.CurrentLimit.GetRequestsPerUnit() != w.per || st.LimitRemaining != w.left {
			t.Errorf("statuses[%d] = %v, want %d/%v with %d left", i, st, w.per, w.unit, w.left)
		}
		if r := st.DurationUntilReset.AsDuration(); r <= 0 || r > w.max+time.Second { // rounded up to ms, from one "now" per request
			t.Errorf("statuses[%d]: duration_until_reset %v, want in (0, %v]", i, r, w.max+time.Second)
		}
	}
	if resp.Statuses[0].CurrentLimit == resp.Statuses[2].CurrentLimit || resp.Statuses[0].DurationUntilReset == resp.Statuses[2].DurationUntilReset {
		t.Error("two descriptors share a message")
	}
	// The headers report the limit closest to exhaustion: x (1 left of 2).
	got := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	if got["x-ratelimit-limit"] != "2" || got["x-ratelimit-remaining"] != "1" || got["ratelimit-limit"] != "2" || got["ratelimit-remaining"] != "1" ||
		got["x-ratelimit-reset"] != got["ratelimit-reset"] || got["ratelimit-reset"] == "" || len(resp.ResponseHeadersToAdd) != 6 {
		t.Errorf("headers %v", got)
	}
}

// One descriptor, Envoy's usual request, costs two allocations beyond
// Limiter.Check: the answer and its numbers' string (an allocation count,
// not a time: it does not depend on the machine).
func TestShouldRateLimitAllocations(t *testing.T) {
	svc := envoyrls.New(envoyrlstest.Limiter(t, unitPolicy), nil)
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("k", "q")}}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 {
		t.Errorf("%.1f allocations per call, want at most 3 (it was 10 before the answer was allocated at once)", allocs)
	}
}
