package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// checkPolicy: pro customers get a new, tighter search limit in dry run;
// 96 requests a day would pass it. Anonymous traffic is limited for real.
const checkPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: day, burst: 10, soft_limit_percent: 80 }
  pro:  { rate: 100, burst: 200 }
rules:
  - name: search-trial
    tier: pro
    scope: "api:search"
    rate: 1
    period: day
    burst: 96
    dry_run: true
  - name: anonymous
    key_prefix: "ip:"
    rate: 1
    period: day
    burst: 2
keys: { acct_pro: pro }
`

type checkBody struct {
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	Limit        int64  `json:"limit"`
	RetryAfterMs int64  `json:"retryAfterMs"`
	Source       string `json:"source"`
	Policy       string `json:"policy"`
	DryRun       bool   `json:"dryRun"`
	WouldAllow   bool   `json:"wouldAllow"`
	Warning      bool   `json:"warning"`
}

// checkServer is POST /check as the limiter serves it: the real handler
// over a real Limiter on a real redis-server, metrics on their own registry.
func checkServer(t *testing.T, src string) (func(body string) checkBody, *prometheus.Registry) {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	reg := prometheus.NewRegistry()
	lim, err := enforcement.New(enforcement.Config{
		Authority: redisstore.New(rdb, "check"), Policy: parse(t, src), Observer: limitmetrics.New(reg),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := httpapi.NewCheckHandler(lim, "", nil)
	return func(body string) checkBody {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r := httptest.NewRequest(http.MethodPost, "/check", strings.NewReader(body)).WithContext(ctx)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("POST /check %s: %d %s", body, w.Code, w.Body)
		}
		var out checkBody
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("decode %s: %v", w.Body, err)
		}
		return out
	}, reg
}

// counter reads one sample of a counter family from reg (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return sample(m)
		}
	}
	return 0
}

func sample(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.GetGauge().GetValue()
}

// TestDryRunThroughCheck: a dry-run rule rejects nothing; each decision
// says dryRun and what enforcement would have done, and the would-be
// rejections are counted per rule, so an operator sees that the new limit
// would refuse 4% of this customer's traffic before enforcing it.
func TestDryRunThroughCheck(t *testing.T) {
	post, reg := checkServer(t, checkPolicy)
	for i := 1; i <= 100; i++ {
		d := post(`{"key":"acct_pro","scope":"api:search"}`)
		if !d.Allowed || !d.DryRun || d.Policy != "search-trial" || d.RetryAfterMs != 0 || d.Limit != 96 {
			t.Fatalf("request %d: %+v, want allowed in dry run under search-trial", i, d)
		}
		if want := i <= 96; d.WouldAllow != want {
			t.Fatalf("request %d: wouldAllow %v, want %v", i, d.WouldAllow, want)
		}
	}
	get := func(outcome string) float64 {
		return counter(t, reg, "limiter_policy_decisions_total", map[string]string{"policy": "search-trial", "outcome": outcome})
	}
	allowed, wouldReject, rejected := get("allowed"), get("would_reject"), get("rejected")
	if allowed != 96 || wouldReject != 4 || rejected != 0 {
		t.Fatalf("search-trial: allowed %v would_reject %v rejected %v; want 96, 4, 0", allowed, wouldReject, rejected)
	}
	t.Logf("search-trial would reject %.0f%% of acct_pro's search traffic", 100*wouldReject/(allowed+wouldReject))

	// An enforced rule, for contrast: rejections are real, and anonymous
	// (ip:) traffic has its own ratio.
	var got []bool
	for i := 0; i < 3; i++ {
		d := post(`{"key":"ip:203.0.113.7","scope":"web"}`)
		if d.DryRun || d.Allowed != d.WouldAllow || d.Policy != "anonymous" {
			t.Fatalf("%+v", d)
		}
		if !d.Allowed && d.RetryAfterMs <= 0 {
			t.Fatalf("rejection without retryAfterMs: %+v", d)
		}
		got = append(got, d.Allowed)
	}
	if fmt.Sprint(got) != "[true true false]" {
		t.Fatalf("anonymous decisions %v, want [true true false]", got)
	}
	if a, r := counter(t, reg, "limiter_policy_decisions_total", map[string]string{"policy": "anonymous", "outcome": "allowed"}),
		counter(t, reg, "limiter_policy_decisions_total", map[string]string{"policy": "anonymous", "outcome": "rejected"}); a != 2 || r != 1 {
		t.Errorf("anonymous: allowed %v rejected %v, want 2 and 1", a, r)
	}
	if a, r := counter(t, reg, "limiter_anonymous_decisions_total", map[string]string{"result": "allowed"}),
		counter(t, reg, "limiter_anonymous_decisions_total", map[string]string{"result": "rejected"}); a != 2 || r != 1 {
		t.Errorf("limiter_anonymous_decisions_total: allowed %v rejected %v, want 2 and 1", a, r)
	}
}

func TestTopLevelDryRunThroughCheck(t *testing.T) {
	post, reg := checkServer(t, "dry_run: true\n"+checkPolicy)
	var wouldReject int
	for i := 0; i < 5; i++ {
		d := post(`{"key":"ip:198.51.100.1","scope":"web"}`)
		if !d.Allowed || !d.DryRun {
			t.Fatalf("%+v: the whole file is in dry run", d)
		}
		if !d.WouldAllow {
			wouldReject++
		}
	}
	if wouldReject != 3 {
		t.Errorf("%d would-be rejections of 5 at burst 2, want 3", wouldReject)
	}
	if n := counter(t, reg, "limiter_policy_decisions_total", map[string]string{"policy": "anonymous", "outcome": "would_reject"}); n != 3 {
		t.Errorf("would_reject = %v, want 3", n)
	}
}

// TestSoftLimitWarningThroughCheck: warning is true exactly when
// consumption reaches soft_limit_percent (80% of a bucket of 10).
func TestSoftLimitWarningThroughCheck(t *testing.T) {
	post, _ := checkServer(t, checkPolicy)
	for _, c := range []struct {
		key     string
		cost    int
		warning bool
	}{
		{"u70", 7, false}, // 70% used
		{"u80", 8, true},  // at the soft limit
		{"u90", 9, true},  // above it
		{"u100", 10, true},
	} {
		d := post(fmt.Sprintf(`{"key":%q,"scope":"web","cost":%d}`, c.key, c.cost))
		if !d.Allowed || d.Warning != c.warning || d.Policy != "free" {
			t.Errorf("cost %d of 10: %+v, want allowed with warning %v", c.cost, d, c.warning)
		}
	}
	// Sequential spending crosses it too. (A rejection decided by the local
	// tier does not compute the warning.)
	var warned []bool
	for i := 0; i < 10; i++ {
		warned = append(warned, post(`{"key":"seq","scope":"web"}`).Warning)
	}
	// The bucket refills 1 token a day: the 9th request leaves 1.00… tokens,
	// past 80% used, and the 8th leaves 2 plus the refill of a few
	// milliseconds, just under it.
	if fmt.Sprint(warned) != "[false false false false false false false false true true]" {
		t.Errorf("warnings %v", warned)
	}
}
