package shadow_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/shadow"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const enforcedYAML = `
version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20, soft_limit_percent: 80 }
rules:
  - { name: search, scope: "api:search", rate: 5, burst: 10 }
`

// The same file with a tighter trial of the search rule, in shadow.
const withShadowYAML = enforcedYAML + `  - { name: search-trial, scope: "api:search", rate: 2, burst: 4, shadow: true }
`

// The trial limit, enforced: what the shadow verdicts must match.
const trialEnforcedYAML = `
version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20, soft_limit_percent: 80 }
rules:
  - { name: search-trial, scope: "api:search", rate: 2, burst: 4 }
`

// clock is a test clock the loop sets before each request: every reading
// in between (the enforced and the shadow decision, the authorities) sees
// the same instant, however many times it is read.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func mustParse(t *testing.T, y string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type counts struct {
	mu          sync.Mutex
	byName      map[string][2]int // [would_reject, allowed]
	unavailable map[string]int
}

func (c *counts) Evaluated(name string, ok, _ bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.byName[name]
	if ok {
		v[1]++
	} else {
		v[0]++
	}
	c.byName[name] = v
}

func (c *counts) Unavailable(reason string) { c.mu.Lock(); c.unavailable[reason]++; c.mu.Unlock() }

func newCounts() *counts { return &counts{byName: map[string][2]int{}, unavailable: map[string]int{}} }

type request struct {
	key, scope string
	at         time.Duration
}

// traffic: one key floods search (covered by the trial), another reads a
// scope no shadow rule covers, 15 ms apart over 1.8 s.
func traffic() []request {
	var out []request
	for i := 0; i < 120; i++ {
		out = append(out, request{"acct_1", "api:search", time.Duration(i) * 15 * time.Millisecond})
		if i%3 == 0 {
			out = append(out, request{"acct_2", "web", time.Duration(i) * 15 * time.Millisecond})
		}
	}
	return out
}

// run sends the traffic through POST /check on a limiter with an
// in-process authority under pol, with a shadow evaluator when sh is set,
// and returns each response body.
func run(t *testing.T, pol *policy.Policy, withShadow bool, obs shadow.Observer) [][]byte {
	t.Helper()
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	start := clk.now()
	cfg := enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.now, 1000), Policy: pol, Now: clk.now}
	if withShadow {
		ev, err := shadow.New(shadow.Config{Authority: enforcement.NewMemoryAuthority(clk.now, 1000), Now: clk.now, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Shadow = ev
	}
	lim, err := enforcement.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := httpapi.NewCheckHandler(lim, "", nil)
	var out [][]byte
	for _, r := range traffic() {
		clk.set(start.Add(r.at))
		w := httptest.NewRecorder()
		body := fmt.Sprintf(`{"key":%q,"scope":%q}`, r.key, r.scope)
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/check", strings.NewReader(body)))
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", body, w.Code, w.Body)
		}
		out = append(out, w.Body.Bytes())
	}
	return out
}

var shadowMember = regexp.MustCompile(`,"shadow":\{"name":"([^"]*)","wouldAllow":(true|false)\}`)

// A shadow rule tighter than the enforced one leaves every enforced
// response unchanged, byte for byte, while its verdicts are exactly the
// decisions of the tighter limit enforced alone.
func TestShadowLeavesEnforcementUnchanged(t *testing.T) {
	base := run(t, mustParse(t, enforcedYAML), false, nil)
	obs := newCounts()
	shadowed := run(t, mustParse(t, withShadowYAML), true, obs)
	trial := run(t, mustParse(t, trialEnforcedYAML), false, nil)

	wouldReject := 0
	for i := range base {
		m := shadowMember.FindSubmatch(shadowed[i])
		stripped := shadowMember.ReplaceAll(shadowed[i], nil)
		if !bytes.Equal(stripped, base[i]) {
			t.Fatalf("response %d changed by the shadow rule:\n with    %s\n without %s", i, shadowed[i], base[i])
		}
		covered := bytes.Contains(base[i], []byte(`"policy":"search"`))
		if covered != (m != nil) {
			t.Fatalf("response %d: shadow member %q, covered by the trial %v", i, m, covered)
		}
		if m == nil {
			continue
		}
		if string(m[1]) != "search-trial" {
			t.Fatalf("response %d: shadow name %q", i, m[1])
		}
		// The trial enforced alone decides the same request the same way.
		want := bytes.Contains(trial[i], []byte(`"wouldAllow":true`))
		if got := string(m[2]) == "true"; got != want {
			t.Fatalf("response %d: shadow wouldAllow %v, the trial limit enforced said %v (%s)", i, got, want, trial[i])
		}
		if string(m[2]) == "false" {
			wouldReject++
		}
	}
	enforcedRejects := bytes.Count(bytes.Join(base, nil), []byte(`"allowed":false`))
	if wouldReject <= enforcedRejects {
		t.Fatalf("the tighter trial would reject %d, enforcement rejected %d: want more", wouldReject, enforcedRejects)
	}
	if c := obs.byName["search-trial"]; c[0] != wouldReject || c[0]+c[1] != 120 {
		t.Fatalf("metrics: %v, want %d would_reject of 120", c, wouldReject)
	}
	t.Logf("enforced rejections %d, trial would reject %d of 120 searches", enforcedRejects, wouldReject)
}

// With a real Redis: the shadow buckets and quota counters live under their
// own prefix, and the enforced bucket holds exactly what a run without the
// shadow rule leaves in it.
func TestShadowNeverSpendsTheEnforcedBucket(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	// Refill of a token an hour: nothing refills during the test, so the
	// counts below are exact whatever the machine's speed.
	const y = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 100, quota: { limit: 1000, period: day } }
rules:
  - { name: trial, scope: "api:search", burst: 5, quota: { limit: 8, period: day }, shadow: true }
`
	const base = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 100, quota: { limit: 1000, period: day } }
`
	decide := func(prefix string, pol *policy.Policy, withShadow bool) []enforcement.Decision {
		cfg := enforcement.Config{Authority: redisstore.New(rdb, prefix), Policy: pol}
		if withShadow {
			ev, err := shadow.New(shadow.Config{Authority: redisstore.New(rdb, prefix+":shadow"), Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			cfg.Shadow = ev
		}
		lim, err := enforcement.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var out []enforcement.Decision
		for i := 0; i < 30; i++ {
			d, err := lim.Check(context.Background(), enforcement.Request{Key: "k1", Scope: "api:search"})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		return out
	}
	without := decide("noshadow", mustParse(t, base), false)
	with := decide("withshadow", mustParse(t, y), true)
	for i := range with {
		a, b := with[i], without[i]
		if a.Allowed != b.Allowed || a.Remaining != b.Remaining || a.Limit != b.Limit || a.Source != b.Source || a.Policy != b.Policy || a.RetryAfter != b.RetryAfter {
			t.Fatalf("decision %d: with shadow %+v, without %+v", i, a, b)
		}
		if !a.Allowed || a.Remaining != int64(99-i) {
			t.Fatalf("decision %d: %+v, want allowed with %d left", i, a, 99-i)
		}
		// Bucket of 5, quota of 8: the first 5 pass, then nothing refills.
		if wantAllow := i < 5; a.Shadow.Name != "trial" || a.Shadow.WouldAllow != wantAllow {
			t.Fatalf("decision %d: shadow %+v, want trial wouldAllow=%v", i, a.Shadow, wantAllow)
		}
	}
	ctx := context.Background()
	enforcedKey := redisstore.New(rdb, "withshadow").BucketKey("k1", "api:search")
	baseKey := redisstore.New(rdb, "noshadow").BucketKey("k1", "api:search")
	shadowKey := redisstore.New(rdb, "withshadow:shadow").BucketKey("k1", "api:search")
	for _, k := range []string{enforcedKey, baseKey, shadowKey} {
		if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("bucket %s: exists=%d err=%v", k, n, err)
		}
	}
	// The enforced quota counter counts the 30 enforced decisions only.
	day := time.Now().UTC().Truncate(24 * time.Hour)
	for _, c := range []struct {
		store, owner string
		want         int64
	}{{"withshadow", "tier:free", 30}, {"noshadow", "tier:free", 30}, {"withshadow:shadow", "rule:trial", 5}} {
		k := redisstore.New(rdb, c.store).QuotaKey("k1", c.owner, day)
		if n, err := rdb.Get(ctx, k).Int64(); err != nil || n != c.want {
			t.Fatalf("quota %s = %d (%v), want %d", k, n, err, c.want)
		}
	}
}

// A shadow store that fails gives no shadow verdict, counted, and leaves
// the enforced decision alone.
func TestFailingShadowStoreMeansNoVerdict(t *testing.T) {
	obs := newCounts()
	// A clock that stands still: no refill between the decisions, however
	// slow the machine.
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	ev, err := shadow.New(shadow.Config{Authority: failing{}, Observer: obs, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	pol := mustParse(t, withShadowYAML)
	lim, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.now, 1<<20), Policy: pol, Shadow: ev, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	// The trial's burst is 4: four decisions need its store, which fails.
	for i := 0; i < 4; i++ {
		d, err := lim.Check(context.Background(), enforcement.Request{Key: "k", Scope: "api:search"})
		if err != nil || !d.Allowed || d.Source != enforcement.SourceShared || d.Shadow != (enforcement.ShadowVerdict{}) {
			t.Fatalf("decision %d: %+v %v", i, d, err)
		}
	}
	if obs.unavailable["store"] != 4 || len(obs.byName) != 0 {
		t.Fatalf("counts: %+v %+v", obs.unavailable, obs.byName)
	}
	// The fifth exceeds the trial's whole burst within the same instant: the
	// shadow's own local tier knows that without its store.
	d, err := lim.Check(context.Background(), enforcement.Request{Key: "k", Scope: "api:search"})
	if err != nil || !d.Allowed || d.Shadow != (enforcement.ShadowVerdict{Name: "search-trial", WouldAllow: false}) {
		t.Fatalf("fifth decision: %+v %v", d, err)
	}
}

type failing struct{}

func (failing) Take(context.Context, string, string, enforcement.Limit, int64) (enforcement.Verdict, error) {
	return enforcement.Verdict{}, fmt.Errorf("shadow store down")
}

// A rollout's candidate is the shadow policy while it is set, ahead of
// the enforced policy's shadow rules, and its verdicts carry the
// rollout's revision; cleared, the shadow rules are back.
func TestRolloutCandidate(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	ev, err := shadow.New(shadow.Config{Authority: enforcement.NewMemoryAuthority(clk.now, 1000), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.now, 1000), Policy: mustParse(t, withShadowYAML), Now: clk.now, Shadow: ev})
	if err != nil {
		t.Fatal(err)
	}
	check := func(scope string) enforcement.ShadowVerdict {
		t.Helper()
		d, err := lim.Check(context.Background(), enforcement.Request{Key: "acct_1", Scope: scope, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return d.Shadow
	}
	if v := check("api:search"); v.Name != "search-trial" || v.Rollout != 0 {
		t.Fatalf("before the rollout: %+v", v)
	}
	if v := check("web"); v.Name != "" {
		t.Fatalf("before the rollout, an uncovered scope: %+v", v)
	}
	// The candidate: web gets a burst of 1, so its second decision is one
	// the candidate denies and the policy in force allows.
	ev.SetRollout(mustParse(t, enforcedYAML+"  - { name: web-tight, scope: web, rate: 0.001, burst: 1 }\n"), 7)
	if v := check("web"); v.Name != "web-tight" || v.Rollout != 7 || !v.WouldAllow {
		t.Fatalf("under the rollout, first: %+v", v)
	}
	if v := check("web"); v.Name != "web-tight" || v.Rollout != 7 || v.WouldAllow {
		t.Fatalf("under the rollout, second: %+v", v)
	}
	if v := check("api:search"); v.Name != "search" || v.Rollout != 7 {
		t.Fatalf("under the rollout, search (the candidate has no trial rule): %+v", v)
	}
	ev.SetRollout(nil, 0)
	if v := check("api:search"); v.Name != "search-trial" || v.Rollout != 0 {
		t.Fatalf("after the rollout: %+v", v)
	}
	if v := check("web"); v.Name != "" {
		t.Fatalf("after the rollout, an uncovered scope: %+v", v)
	}
}
