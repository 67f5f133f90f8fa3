package envoyrls_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/dunglas/httpsfv"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
)

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		m[h.Key] = h.Value
	}
	return m
}

// The draft's fields are off by default (today's answers unchanged) and
// sent beside or instead of the legacy ones when asked.
func TestDraftHeaders(t *testing.T) {
	lim := envoyrlstest.Limiter(t, unitPolicy)
	svc := envoyrls.New(lim, nil)
	if h := headerMap(call(t, svc, d("k", "dflt"))); h["ratelimit-policy"] != "" || h["ratelimit"] != "" || h["ratelimit-limit"] != "2" {
		t.Fatalf("default: %v", h)
	}

	svc.SetHeaderMode(ratelimitheader.Draft)
	h := headerMap(call(t, svc, d("k", "dr")))
	if h["ratelimit-limit"] != "" || h["x-ratelimit-limit"] != "" || h["ratelimit-policy"] != `"free";q=2;w=7200` {
		t.Fatalf("draft: %v", h)
	}
	call(t, svc, d("k", "dr"))
	h = headerMap(call(t, svc, d("k", "dr"))) // burst 2 spent: rejected
	l, err := httpsfv.UnmarshalList([]string{h["ratelimit"]})
	if err != nil || len(l) != 1 {
		t.Fatalf("ratelimit %q: %v", h["ratelimit"], err)
	}
	it := l[0].(httpsfv.Item)
	r, _ := it.Params.Get("r")
	tt, _ := it.Params.Get("t")
	if it.Value != "free" || r != int64(0) || strconv.FormatInt(tt.(int64), 10) != h["retry-after"] {
		t.Fatalf("rejected: %v", h)
	}

	// A quota is the second item.
	svc.SetHeaderMode(ratelimitheader.Both)
	h = headerMap(call(t, svc, d("k", "q")))
	if h["ratelimit-limit"] == "" || h["ratelimit-policy"] != `"big";q=10;w=10, "big-quota";q=4;w=86400` {
		t.Fatalf("both, quota: %v", h)
	}
	if _, err := httpsfv.UnmarshalList([]string{h["ratelimit"]}); err != nil {
		t.Fatalf("ratelimit %q: %v", h["ratelimit"], err)
	}
}

// BenchmarkShouldRateLimitDraft: BenchmarkShouldRateLimit with the draft's
// fields beside the legacy ones.
func BenchmarkShouldRateLimitDraft(b *testing.B) {
	lim := envoyrlstest.Limiter(b, envoyrlstest.BenchPolicy)
	svc := envoyrls.New(lim, nil)
	svc.SetHeaderMode(ratelimitheader.Both)
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: "acct_" + strconv.Itoa(i)}}}}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
	}
}
