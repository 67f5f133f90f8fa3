package envoyrls_test

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
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
	lim := newLimiter(t, unitPolicy)
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
	lim := newLimiter(t, unitPolicy)
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
	lim := newLimiter(t, unitPolicy)
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
