package usage

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/testkit/browser"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestDashboardInBrowser loads the page in headless Chromium with seeded
// data, enters a portal token, and checks that one chart per scope rendered
// and that the totals shown equal the API's; it saves screenshots (desktop
// and phone width) to testdata-artifacts/.
func TestDashboardInBrowser(t *testing.T) {
	now := time.Now().UTC()
	e := newEnv(t, sharedCH, now)
	e.srv.cfg.Now = time.Now
	var ds []decision
	scopes := []string{"api:search", "api:write", "health"}
	for i := 0; i < 3000; i++ {
		// Between 20 h and 10 min ago: inside any "last 24 hours" window.
		ts := now.Add(-10*time.Minute - time.Duration(i)*(20*time.Hour-10*time.Minute)/3000)
		ds = append(ds, decision{ts: ts, key: "acct_dash", scope: scopes[i%3], tier: "enterprise",
			cost: uint64(1 + i%5), allowed: i%7 != 0 && !(i > 2500 && i%2 == 0), warning: i < 150})
	}
	seed(t, e.conn, e.db, ds)
	// The limiter's Redis, for what the quota counter says is left.
	rds := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	srv, err := New(Config{Store: e.store, Signer: e.signer, AdminToken: testAdmin, PolicyPath: e.policy,
		QueryTimeout: 30 * time.Second, Redis: rdb, KeyPrefix: "rb"})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	e.http.Config.Handler = srv.Handler()
	tok := e.issue("acct_dash", 3600).Token
	code, b := e.do("GET", "/v1/quota", tok, "")
	quota := decode[quotaResponse](t, b).Quota
	if code != 200 || quota == nil {
		t.Fatalf("quota: %d %s", code, b)
	}
	monthStart, _ := limits.PeriodMonth.Window(now)
	counter := limits.QuotaKey("rb", "acct_dash", quota.QuotaID, monthStart)
	if err := rdb.Set(context.Background(), counter, quota.Used, 0).Err(); err != nil { // Redis agrees with the record
		t.Fatal(err)
	}

	q := url.Values{"from": {now.Add(-24 * time.Hour).Format(time.RFC3339)}, "to": {now.Format(time.RFC3339)}, "window": {"hour"}}
	code, b = e.do("GET", "/v1/usage?"+q.Encode(), tok, "")
	if code != 200 {
		t.Fatalf("api: %d %s", code, b)
	}
	api := decode[usageResponse](t, b).Totals
	if api.Requests != uint64(len(ds)) {
		t.Fatalf("api totals %+v, want %d requests", api, len(ds))
	}

	ctx, cancel := browser.Start(t)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("browser, %s: %v", what, err)
		}
	}
	text := func(id string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID(id)))
		if err != nil {
			t.Fatalf("browser, text of #%s: %v", id, err)
		}
		return v
	}
	attr := func(id, name string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.ID(id), name))
		if err != nil {
			t.Fatalf("browser, %s of #%s: %v", name, id, err)
		}
		return v.Value
	}
	eval := func(js string) int {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("browser, %s: %v", js, err)
		}
		return v
	}
	// Quality 100 makes a PNG (below 100 chromedp takes a JPEG).
	screenshot := func(name string, quality int) {
		t.Helper()
		shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(quality))
		if err != nil {
			t.Fatalf("browser, screenshot: %v", err)
		}
		path := filepath.Join(browser.Artifacts(t), name)
		if err := os.WriteFile(path, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	enter := func(token, state string) {
		t.Helper()
		do("enter a token",
			chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SendKeys(chromedp.ID("token"), token),
			chromedp.Click(chromedp.ID("load")),
			chromedp.WaitVisible(chromedp.CSS(`body[data-state="`+state+`"]`)),
		)
	}

	do("open the page", chromedp.Navigate(e.http.URL+"/"))
	enter(tok, "ready")
	if n := eval(`document.querySelectorAll("#charts .chart .uplot canvas").length`); n != len(scopes) {
		t.Errorf("%d charts rendered, want %d (one per scope)", n, len(scopes))
	}
	if n := eval(`Math.min.apply(null, Array.from(document.querySelectorAll("#charts canvas")).map(c => c.width))`); n < 200 {
		t.Errorf("charts are %d px wide", n)
	}
	for _, tc := range []struct {
		id   string
		want uint64
	}{{"total-requests", api.Requests}, {"total-allowed", api.Allowed}, {"total-rejected", api.Rejected}, {"total-cost", api.Cost}} {
		if got := attr(tc.id, "data-value"); got != strconv.FormatUint(tc.want, 10) {
			t.Errorf("#%s shows %q, the API says %d", tc.id, got, tc.want)
		}
	}
	// The visible text matches too (formatted with separators).
	if got := strings.NewReplacer(",", "", ".", "", " ", "", "\u202f", "", "\u00a0", "").Replace(text("total-requests")); got != strconv.FormatUint(api.Requests, 10) {
		t.Errorf("requests shown as %q, want %d", got, api.Requests)
	}
	if q, badge, status := text("quota-body"), text("soft-state"), text("status"); !strings.Contains(q, "of 1,000 tokens this month") || badge != "soft limit reached" || strings.TrimSpace(status) != "" {
		t.Errorf("quota %q, badge %q, status %q", q, badge, status)
	}
	if q := text("quota-body"); !strings.Contains(q, "left according to the limiter") || strings.Contains(q, "usage record") {
		t.Errorf("quota while Redis agrees: %q", q)
	}
	screenshot("usage-dashboard.png", 100)

	// Phone width: the layout reflows and nothing scrolls sideways.
	// The charts redraw at the new width in the page's resize handler; a
	// loaded machine runs it late, so poll rather than pause for a while.
	do("phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
	for reflow := time.Now().Add(30 * time.Second); eval(`document.documentElement.scrollWidth > window.innerWidth + 1 ? 1 : 0`) != 0; {
		if time.Now().After(reflow) {
			t.Error("the page scrolls sideways at 390 px")
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	screenshot("usage-dashboard-phone.png", 100)
	do("desktop viewport", chromedp.EmulateViewport(1280, 900))

	// Redis loses the counter: the page says so plainly, and shows what the
	// limiter will admit meanwhile.
	if err := rdb.Del(context.Background(), counter).Err(); err != nil {
		t.Fatal(err)
	}
	do("refresh after the counter is lost",
		chromedp.Click(chromedp.ID("refresh")),
		chromedp.WaitVisible(chromedp.CSS(`#quota-body .notice.redis_behind`)),
	)
	if q := text("quota-body"); !strings.Contains(q, "fewer tokens than the usage record") || !strings.Contains(q, "1,000 left according to the limiter") {
		t.Errorf("quota after Redis lost the counter: %q", q)
	}
	screenshot("usage-dashboard-redis-behind.png", 100)

	// No script error and no CSP violation so far.
	if v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.getAttribute("data-page-errors") || ""`)); err != nil || v != "" {
		t.Errorf("page errors: %q %v", v, err)
	}

	// Error state: a bad token gives a readable message.
	do("forget the token", chromedp.Click(chromedp.ID("forget")))
	enter(tok[:len(tok)-4]+"AAAA", "error")
	if s := text("status"); !strings.Contains(s, "not accepted") {
		t.Errorf("error state says %q", s)
	}

	// Empty state: a key with no traffic.
	do("forget the token", chromedp.Click(chromedp.ID("forget")))
	enter(e.issue("acct_empty", 3600).Token, "ready")
	if s := text("status"); !strings.Contains(s, "No traffic in this range") {
		t.Errorf("empty state says %q", s)
	}
}
