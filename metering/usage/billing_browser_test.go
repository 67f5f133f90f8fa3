package usage

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/testkit/browser"
)

// TestDashboardShowsStatements: the dashboard, in headless Chromium with a
// portal token, shows this month's statement beside last month's, with
// the figures GET /v1/statement answers, and a credit as a line of its
// own with its reason (written by the meter-consumer's sink, as the
// pipeline writes a correction's events).
func TestDashboardShowsStatements(t *testing.T) {
	now := time.Now().UTC()
	e := newEnv(t, sharedCH, now)
	store, err := chstore.New(e.conn, e.db)
	if err != nil {
		t.Fatal(err)
	}
	st := &billing.Statements{Store: store}
	srv, err := New(Config{Store: e.store, Signer: e.signer, AdminToken: testAdmin, PolicyPath: e.policy, QueryTimeout: 30 * time.Second,
		Statement: func(ctx context.Context, key, period, tz string) (any, error) {
			p, err := billing.ParsePeriod(period, tz)
			if err != nil {
				return nil, err
			}
			return st.Get(ctx, key, p, false)
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	e.http.Config.Handler = srv.Handler()

	// Usage in this month and the last (UTC: the browser's zone here).
	cur := billing.PeriodOf(now, time.UTC)
	curStart, _ := cur.Bounds()
	prevStart, _ := cur.Add(-1).Bounds()
	var ds []decision
	for i := 0; i < 40; i++ {
		at := curStart.Add(now.Sub(curStart) * time.Duration(i) / 40)
		if i%2 == 1 {
			at = prevStart.Add(time.Duration(i) * time.Hour)
		}
		ds = append(ds, decision{ts: at, key: "acct_bill", scope: "api:search", tier: "pro", cost: 2, allowed: i%5 != 0})
	}
	seed(t, e.conn, e.db, ds)
	credit := billing.Correction{ID: "goodwill-1", Key: "acct_bill", Kind: billing.KindCredit, Reason: "outage credit", Operator: "admin",
		RecordedAt: now, Pieces: []billing.Piece{{TS: curStart.UnixMilli(), Scope: "api:search", Cost: -3}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := store.WriteCorrection(ctx, credit); err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(e.conn, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := sink.Progress(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, 0, []chsink.Record{{Offset: 0, Event: billing.Events(credit)[0]}}, 0, &prog); err != nil {
		t.Fatal(err)
	}

	tok := e.issue("acct_bill", 3600).Token
	want := map[string]billing.Statement{}
	for _, p := range []billing.Period{cur, cur.Add(-1)} {
		code, b := e.do("GET", "/v1/statement?"+url.Values{"period": {p.String()}, "tz": {"UTC"}}.Encode(), tok, "")
		var s billing.Statement
		if code != 200 || json.Unmarshal(b, &s) != nil || s.Totals.Requests != 20 {
			t.Fatalf("statement %s: %d %s", p, code, b)
		}
		want[p.String()] = s
	}
	if c := want[cur.String()]; len(c.Corrections) != 1 || c.Corrections[0].Cost != -3 {
		t.Fatalf("this month's corrections: %+v", c.Corrections)
	}
	if code, _ := e.do("GET", "/v1/statement?key=acct_other&period="+cur.String(), tok, ""); code != 403 {
		t.Errorf("a portal token reads another key's statement: %d", code)
	}

	ctx, cancelB := browser.Start(t)
	defer cancelB()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(e.http.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), tok),
		chromedp.Click(chromedp.ID("load")),
		chromedp.WaitVisible(chromedp.CSS(`body[data-state="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#period-previous table`)),
	); err != nil {
		t.Fatalf("browser: %v", err)
	}
	for id, p := range map[string]billing.Period{"period-current": cur, "period-previous": cur.Add(-1)} {
		s := want[p.String()]
		for k, v := range map[string]int64{"requests": s.Totals.Requests, "cost": s.Totals.Cost} {
			got, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`#`+id+` [data-total="`+k+`"]`), "data-value"))
			if err != nil || got.Value != strconv.FormatInt(v, 10) {
				t.Errorf("#%s %s shows %q (%v), the API says %d", id, k, got.Value, err, v)
			}
		}
		if per, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.ID(id), "data-period")); err != nil || per.Value != p.String() {
			t.Errorf("#%s is period %q, want %s", id, per.Value, p)
		}
	}
	line, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#period-current tr[data-line="correction"]`)))
	if err != nil || !strings.Contains(line, "goodwill-1: outage credit") || !strings.Contains(line, "-3") {
		t.Errorf("the credit's line: %q %v", line, err)
	}
	if v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.getAttribute("data-page-errors") || ""`)); err != nil || v != "" {
		t.Errorf("page errors: %q %v", v, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser, screenshot: %v", err)
	}
	path := filepath.Join(browser.Artifacts(t), "usage-dashboard-statements.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
