package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/browser"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// supportPagePolicy refills one token an hour: a key that spent its five
// stays empty for the whole test, however slow the machine.
const supportPagePolicy = `version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 5 }
`

// TestSupportPageE2E is the support page against real servers: the
// limiter and usage-api binaries, one redis-server, one clickhouse-server.
// The policy and an override of the key are pushed through the usage
// API's policy log. Through the API: an operator's token is required; a read-only operator
// finds and inspects a key but its reset is refused, and audited; a reset
// without a reason is refused by the limiter, and audited. Then in
// headless Chromium, as an operator who may reset: search, inspect (the
// exhausted bucket, the override with its author and reason, the
// limiter's view), reset with a reason, and the
// reset shown in the audit with its author; the limiter answers from the
// new state.
func TestSupportPageE2E(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(time.Minute))
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	line, err := exec.Command(filepath.Join(bins, "limiter"), "policy", "keygen", "usage-api", "--out", filepath.Join(dir, "api.pem")).Output()
	if err != nil {
		t.Fatalf("keygen: %v", err)
	}
	const (
		admin      = "e2e-admin-token-0123456789"
		aliceToken = "alice-support-token-0123456789"
		ritaToken  = "rita-support-token-0123456789"
		limToken   = "e2e-limiter-token-0123456789"
	)
	files := map[string]string{
		"keyring":     string(line),
		"tokens":      "alice overrides " + aliceToken + "\nrita read " + ritaToken + "\n",
		"policy.yaml": supportPagePolicy,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", "REDIS_ADDRS="+r.Addr(), "POLICY_FILE="+filepath.Join(dir, "policy.yaml"),
		"LIMITER_AUTH_TOKEN="+limToken, "POLICY_TRUSTED_KEYS_FILE="+filepath.Join(dir, "keyring"), "LIMITER_GRPC_ADDR=",
		"KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka")
	api := start(t, "usage-api", "USAGE_API_ADDR", "/healthz", "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db, "KAFKA_BROKERS="+k.Addr(),
		"USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef", "REDIS_ADDRS="+r.Addr(),
		"POLICY_FILE="+filepath.Join(dir, "policy.yaml"), "LIMITER_FLEET_URLS="+limiter.url, "LIMITER_AUTH_TOKEN="+limToken,
		"USAGE_ADMIN_TOKENS_FILE="+filepath.Join(dir, "tokens"),
		"POLICY_SIGNING_KEY_FILE="+filepath.Join(dir, "api.pem"), "POLICY_TRUSTED_KEYS_FILE="+filepath.Join(dir, "keyring"))

	// The policy in the log, and alice's override of acct_8812 (a burst of
	// 3), applied by the limiter.
	doc, _ := json.Marshal(map[string]any{"document": supportPagePolicy, "message": "first"})
	if code, b := call(t, "PUT", api.url+"/v1/admin/policy", admin, string(doc)); code != 200 {
		t.Fatalf("push: %d %s", code, b)
	}
	const overrideReason = "deal 12: a smaller burst"
	if code, b := call(t, "PUT", api.url+"/v1/admin/overrides/acct_8812", aliceToken,
		`{"rate": 1, "period": "hour", "burst": 3, "reason": "`+overrideReason+`"}`); code != 200 {
		t.Fatalf("alice sets an override: %d %s", code, b)
	}
	testenv.WaitFor(t, 30*time.Second, "the limiter applies the override", func() bool {
		code, b := call(t, "GET", limiter.url+"/admin/keys/local?key=acct_8812&scope=api", limToken, "")
		var a support.LocalAnswer
		return code == 200 && json.Unmarshal(b, &a) == nil && a.Rule != nil && a.Rule.Override != nil
	})

	// acct_8812 spends its bucket on the limiter; its decisions are in
	// ClickHouse as the pipeline writes them (and a key that the search
	// must not find).
	check := func() bool {
		t.Helper()
		code, b := call(t, "POST", limiter.url+"/check", limToken, `{"key":"acct_8812","scope":"api"}`)
		var d struct{ Allowed bool }
		if code != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("check: %d %s", code, b)
		}
		return d.Allowed
	}
	for i := 0; check(); i++ {
		if i > 10 {
			t.Fatal("never rejected")
		}
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".decisions_raw (event_id, ts, event_time, key, scope, allowed, source, remaining, policy, instance)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, k := range []string{"acct_8812", "acct_8812", "acct_9000"} {
		at := now.Add(-time.Duration(i) * time.Minute)
		if err := batch.Append(fmt.Sprintf("e%d", i), uint64(at.UnixMilli()), at.UTC(), k, "api", uint8(i%2), "shared", int64(0), "free", "limiter-0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}

	// The API: who may do what.
	if code, b := call(t, "GET", api.url+"/v1/admin/keys/search?q=acct_88", "", ""); code != 401 {
		t.Fatalf("search without a token: %d %s", code, b)
	}
	code, b := call(t, "GET", api.url+"/v1/admin/keys/search?q=acct_88", ritaToken, "")
	var found struct{ Keys []support.Found }
	if code != 200 || json.Unmarshal(b, &found) != nil || len(found.Keys) != 1 || found.Keys[0].Key != "acct_8812" || found.Keys[0].Requests != 2 {
		t.Fatalf("search as rita: %d %s; want acct_8812 alone, 2 requests", code, b)
	}
	inspect := func() support.Report {
		t.Helper()
		code, b := call(t, "GET", api.url+"/v1/admin/keys/inspect?"+url.Values{"key": {"acct_8812"}, "scope": {"api"}}.Encode(), ritaToken, "")
		var rep support.Report
		if code != 200 || json.Unmarshal(b, &rep) != nil {
			t.Fatalf("inspect: %d %s", code, b)
		}
		return rep
	}
	rep := inspect()
	if rep.Bucket.BucketView == nil || rep.Bucket.Tokens >= 1 || rep.Bucket.Capacity != 3 {
		t.Fatalf("bucket: %+v %q; want empty of 3 (the override's burst)", rep.Bucket.BucketView, rep.Bucket.Error)
	}
	if o := rep.Rule.Override; o == nil || o.Author != "usage-api/alice" || o.Reason != overrideReason || o.RecordError != "" {
		t.Fatalf("the rule's override: %+v; want alice's, with its reason", o)
	}
	if len(rep.Limiters) != 1 || rep.Limiters[0].Error != "" || !rep.Limiters[0].View.Held {
		t.Fatalf("limiters: %+v", rep.Limiters)
	}
	if len(rep.Decisions.Rows) != 2 {
		t.Fatalf("decisions: %+v", rep.Decisions)
	}
	if code, b := call(t, "POST", api.url+"/v1/admin/keys/reset", ritaToken, `{"key":"acct_8812","scope":"api","op":"refill","reason":"rita tries"}`); code != 403 || !strings.Contains(string(b), support.CodeForbidden) {
		t.Fatalf("reset by a read-only operator: %d %s; want 403 forbidden", code, b)
	}
	if code, b := call(t, "POST", api.url+"/v1/admin/keys/reset", aliceToken, `{"key":"acct_8812","scope":"api","op":"refill","reason":"  "}`); code != 400 || !strings.Contains(string(b), support.CodeReasonRequired) {
		t.Fatalf("reset without a reason: %d %s; want 400 reason_required", code, b)
	}
	audits := func(rep support.Report) []support.Audit {
		var out []support.Audit
		for _, raw := range rep.Resets {
			var a support.Audit
			if err := json.Unmarshal(raw, &a); err != nil {
				t.Fatal(err)
			}
			out = append(out, a)
		}
		return out
	}
	as := audits(inspect())
	if len(as) != 2 || as[0].Code != support.CodeReasonRequired || as[0].Author != "usage-api/alice" ||
		as[1].Code != support.CodeForbidden || as[1].Author != "rita" || as[1].By != "usage-api" {
		t.Fatalf("the refusals' audit, newest first: %+v", as)
	}

	// The page, as alice.
	bctx, cancelB := browser.Start(t)
	defer cancelB()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("browser, %s: %v", what, err)
		}
	}
	do("sign in and search",
		chromedp.Navigate(api.url+"/support"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), aliceToken),
		chromedp.Click(chromedp.ID("load")),
		chromedp.WaitVisible(chromedp.ID("q")),
		chromedp.SendKeys(chromedp.ID("q"), "acct_88"),
		chromedp.Click(chromedp.ID("search")),
		chromedp.WaitVisible(chromedp.CSS(`#results button[data-key="acct_8812"][data-scope="api"]`)),
	)
	do("inspect",
		chromedp.Click(chromedp.CSS(`#results button[data-key="acct_8812"]`)),
		chromedp.WaitVisible(chromedp.CSS(`body[data-state="inspected"] [data-part="bucket"] [data-field="bucket"]`)),
	)
	bucket, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`[data-part="bucket"] [data-field="bucket"]`)))
	if err != nil || !strings.Contains(bucket, "of 3 tokens") {
		t.Errorf("the bucket shown: %q %v", bucket, err)
	}
	ovText, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`[data-part="rule"] [data-field="override"]`)))
	if err != nil || !strings.Contains(ovText, "by usage-api/alice") || !strings.Contains(ovText, overrideReason) {
		t.Errorf("the override shown: %q %v", ovText, err)
	}
	lims, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID("limiters")))
	if err != nil || !strings.Contains(lims, limiter.url) || !strings.Contains(lims, "store said") {
		t.Errorf("the limiters shown: %q %v", lims, err)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#resets tbody tr[data-result=refused]").length`)); err != nil || n != 2 {
		t.Errorf("the refusals shown in the audit: %d %v, want 2", n, err)
	}
	const reason = "ticket 4411: charged twice by the settle bug"
	do("reset",
		chromedp.SetValue(chromedp.ID("op"), "refill"),
		chromedp.SendKeys(chromedp.ID("reason"), reason),
		chromedp.Click(chromedp.ID("reset")),
		chromedp.WaitVisible(chromedp.CSS(`#reset-status[data-result="applied"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#resets tbody tr[data-result="applied"][data-author="usage-api/alice"]`)),
	)
	row, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#resets tbody tr[data-result="applied"]`)))
	if err != nil || !strings.Contains(row, reason) || !strings.Contains(row, "refill") {
		t.Errorf("the reset's row in the audit: %q %v", row, err)
	}
	if v, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.documentElement.getAttribute("data-page-errors") || ""`)); err != nil || v != "" {
		t.Errorf("page errors: %q %v", v, err)
	}
	if shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100)); err == nil {
		path := filepath.Join(browser.Artifacts(t), "usage-support-page.png")
		if err := os.WriteFile(path, shot, 0o644); err == nil {
			t.Logf("screenshot: %s", path)
		}
	}

	// The reset is in the store: the audit has it, and the limiter
	// answers from the refilled bucket.
	as = audits(inspect())
	if len(as) != 3 || as[0].Result != "applied" || as[0].Author != "usage-api/alice" || as[0].Reason != reason {
		t.Fatalf("the audit after the reset: %+v", as)
	}
	if !check() {
		t.Fatal("the limiter still rejects after the refill")
	}
}
