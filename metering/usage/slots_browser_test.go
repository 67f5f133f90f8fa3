package usage

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/ratewarden/ratewarden/testkit/browser"
)

// TestDashboardShowsSlots: the dashboard, in headless Chromium with a
// portal token, shows the key's concurrency: per scope the peak in flight
// and the slots taken, refused, shed and released over the range, the
// sheds per priority class, and a chart of the peak per bucket, with the
// figures the events make (written by the meter-consumer's own sink).
func TestDashboardShowsSlots(t *testing.T) {
	now := time.Now().UTC()
	e := newEnv(t, sharedCH, now)
	e.srv.cfg.Now = time.Now
	_, hours := writeSlotEvents(t, e, "acct_dash", now)
	var want SlotCounts
	for _, h := range hours {
		want.PeakInFlight = max(want.PeakInFlight, h.PeakInFlight)
		want.Taken += h.Taken
		want.Refused += h.Refused
		want.Shed += h.Shed
		want.Released += h.Released
		for c, n := range h.ShedByPriority {
			if want.ShedByPriority == nil {
				want.ShedByPriority = map[string]uint64{}
			}
			want.ShedByPriority[c] += n
		}
	}
	if len(want.ShedByPriority) != 2 || want.Shed == 0 || want.PeakInFlight == 0 {
		t.Fatalf("the seeded events shed nothing per class: %+v", want)
	}
	tok := e.issue("acct_dash", 3600).Token

	ctx, cancel := browser.Start(t)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(e.http.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), tok),
		chromedp.Click(chromedp.ID("load")),
		chromedp.WaitVisible(chromedp.CSS(`#slots[data-state="ready"]`)),
	); err != nil {
		t.Fatalf("browser: %v", err)
	}
	attr := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), "data-value"))
		if err != nil {
			t.Fatalf("browser, data-value of %s: %v", sel, err)
		}
		return v.Value
	}
	row := `#slots-body tr[data-scope="reports:export"] `
	for name, v := range map[string]uint64{"peak": want.PeakInFlight, "taken": want.Taken, "refused": want.Refused, "shed": want.Shed, "released": want.Released} {
		if got := attr(row + `[data-slot="` + name + `"]`); got != strconv.FormatUint(v, 10) {
			t.Errorf("%s shows %s, the events make %d", name, got, v)
		}
	}
	if got := attr("#slots-peak"); got != strconv.FormatUint(want.PeakInFlight, 10) {
		t.Errorf("the peak in flight shows %s, want %d", got, want.PeakInFlight)
	}
	for class, v := range want.ShedByPriority {
		if got := attr(`#slots-shed-body tr[data-priority="` + class + `"] td`); got != strconv.FormatUint(v, 10) {
			t.Errorf("class %s shed %s, want %d", class, got, v)
		}
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#slots-chart .uplot canvas").length`)); err != nil || n != 1 {
		t.Errorf("%d charts of the peak in flight (%v), want 1", n, err)
	}
	if v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.getAttribute("data-page-errors") || ""`)); err != nil || v != "" {
		t.Errorf("page errors: %q %v", v, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser, screenshot: %v", err)
	}
	path := filepath.Join(browser.Artifacts(t), "usage-dashboard-slots.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
