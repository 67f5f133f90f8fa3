package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestBillingE2E: the real binaries. Checks through the limiter reach the
// rollups; a credit through POST /v1/admin/corrections (sent twice, once
// by the CLI) is recorded under the credential's identity, counts once,
// and the statement (API and CLI, both verified against the raw record)
// is the checks' usage net of it. Credentials without a writing role, bad
// periods and zones are refused.
func TestBillingE2E(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 2)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	tokens := filepath.Join(dir, "tokens")
	accounts := filepath.Join(dir, "accounts")
	if err := os.WriteFile(accounts, []byte("# key account\nacct_bill cust_bill\nacct_bill_staging cust_bill\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte("carol overrides carol-e2e-token-0123456789\nreader read reader-e2e-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"KAFKA_BROKERS=" + kafka.Addr(), "KAFKA_TOPIC=" + kafka.Topic(), "CLICKHOUSE_ADDR=" + ch.Addr(),
		"CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy, "BILLING_ACCOUNTS_FILE=" + accounts}
	start(t, "meter-consumer", "METER_ADDR", "/readyz", append(common, "METER_BATCH_WAIT=50ms")...)
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", common...)
	const admin = "e2e-admin-token-0123456789"
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(common, "USAGE_ADMIN_TOKEN="+admin,
		"USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef", "USAGE_ADMIN_TOKENS_FILE="+tokens)...)

	allowed := 0
	for i := 0; i < 12; i++ {
		code, b := call(t, "POST", limiter.url+"/check", "", `{"key":"acct_bill","scope":"api:read"}`)
		var d struct{ Allowed bool }
		if code != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("check: %d %s", code, b)
		}
		if d.Allowed {
			allowed++ // api:read costs 1
		}
	}
	allowedStaging := 0
	for i := 0; i < 3; i++ {
		code, b := call(t, "POST", limiter.url+"/check", "", `{"key":"acct_bill_staging","scope":"api:read"}`)
		var d struct{ Allowed bool }
		if code != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("check: %d %s", code, b)
		}
		if d.Allowed {
			allowedStaging++
		}
	}
	period := time.Now().UTC().Format("2006-01")
	stURL := api.url + "/v1/admin/statements/acct_bill?period=" + period + "&verify=true"
	type statement struct {
		State       string
		Totals      struct{ Requests, Cost int64 }
		Corrections []struct {
			ID, Operator, Reason string
			Cost                 int64
		}
		Verified *bool
	}
	get := func() statement {
		code, b := call(t, "GET", stURL, "reader-e2e-token-0123456789", "")
		var s statement
		if code != 200 || json.Unmarshal(b, &s) != nil {
			t.Fatalf("statement: %d %s", code, b)
		}
		return s
	}
	waitBilling(t, "the checks in the statement", func() bool { s := get(); return s.Totals.Requests == 12 })
	if s := get(); s.State != "open" || s.Totals.Cost != int64(allowed) || s.Verified == nil || !*s.Verified {
		t.Fatalf("statement %+v, want 12 requests, cost %d, verified", s, allowed)
	}

	body := `{"id":"e2e-credit","key":"acct_bill","cost":-2,"reason":"goodwill"}`
	if code, b := call(t, "POST", api.url+"/v1/admin/corrections", "reader-e2e-token-0123456789", body); code != 403 {
		t.Fatalf("a read-only credential corrects: %d %s", code, b)
	}
	code, b := call(t, "POST", api.url+"/v1/admin/corrections", "carol-e2e-token-0123456789", body)
	if code != 200 || !strings.Contains(string(b), `"operator":"carol"`) || !strings.Contains(string(b), `"created":true`) {
		t.Fatalf("credit: %d %s", code, b)
	}
	if code, b := call(t, "POST", api.url+"/v1/admin/corrections", admin, body); code != 200 || !strings.Contains(string(b), `"created":false`) {
		t.Fatalf("the credit again: %d %s", code, b)
	}
	cli := exec.Command(filepath.Join(bins, "usage-api"), "correct", "--id", "e2e-credit", "--key", "acct_bill", "--cost", "-2", "--reason", "goodwill")
	cli.Env = append(os.Environ(), common...)
	if out, err := cli.CombinedOutput(); err != nil || !strings.Contains(string(out), "already recorded") {
		t.Fatalf("the credit from the CLI: %v %s", err, out)
	}
	if code, b := call(t, "POST", api.url+"/v1/admin/corrections", admin, strings.Replace(body, "goodwill", "other", 1)); code != 409 {
		t.Fatalf("the same id, another request: %d %s", code, b)
	}
	waitBilling(t, "the credit in the statement", func() bool { s := get(); return s.Totals.Cost == int64(allowed)-2 })
	s := get()
	if len(s.Corrections) != 1 || s.Corrections[0].Operator != "carol" || s.Corrections[0].Cost != -2 || !*s.Verified {
		t.Fatalf("statement after the credit: %+v", s)
	}
	// The key's corrections as recorded: the credit once, by carol.
	code, b = call(t, "GET", api.url+"/v1/admin/corrections?key=acct_bill", "reader-e2e-token-0123456789", "")
	var list struct {
		Corrections []struct {
			ID, Kind, Operator string
			Net                struct{ Requests, Cost int64 }
		}
	}
	if code != 200 || json.Unmarshal(b, &list) != nil || len(list.Corrections) != 1 || list.Corrections[0].ID != "e2e-credit" ||
		list.Corrections[0].Kind != "credit" || list.Corrections[0].Operator != "carol" || list.Corrections[0].Net.Cost != -2 {
		t.Fatalf("the key's corrections: %d %s", code, b)
	}
	cmd := exec.Command(filepath.Join(bins, "usage-api"), "statement", "acct_bill", "--period", period, "--verify")
	cmd.Env = append(os.Environ(), common...)
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "verified: true") || !strings.Contains(string(out), "correction e2e-credit") ||
		!strings.Contains(" "+strings.Join(strings.Fields(string(out)), " ")+" ", fmt.Sprintf(" total 12 %d ", allowed-2)) {
		t.Fatalf("statement from the CLI: %v\n%s", err, out)
	}

	// The account: both keys' statements and their sum, verified, from
	// the API and the CLI.
	var acct struct {
		Account, State string
		Keys           []struct{ Key string }
		Totals         struct{ Requests, Cost int64 }
		Verified       *bool
	}
	waitBilling(t, "the staging key in the account", func() bool {
		code, b := call(t, "GET", api.url+"/v1/admin/account-statements/cust_bill?verify=true&period="+period, "reader-e2e-token-0123456789", "")
		if code != 200 || json.Unmarshal(b, &acct) != nil {
			t.Fatalf("account statement: %d %s", code, b)
		}
		return acct.Totals.Requests == 15
	})
	if acct.Account != "cust_bill" || acct.State != "open" || len(acct.Keys) != 2 || acct.Keys[0].Key != "acct_bill" || acct.Keys[1].Key != "acct_bill_staging" ||
		acct.Totals.Cost != int64(allowed+allowedStaging-2) || acct.Verified == nil || !*acct.Verified {
		t.Fatalf("account statement %+v, want both keys, 15 requests, cost %d, verified", acct, allowed+allowedStaging-2)
	}
	cmd = exec.Command(filepath.Join(bins, "usage-api"), "statement", "--account", "cust_bill", "--period", period, "--verify")
	cmd.Env = append(os.Environ(), common...)
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "account verified: true") ||
		!strings.Contains(string(out), fmt.Sprintf("account total: 15 requests, %d cost", allowed+allowedStaging-2)) || !strings.Contains(string(out), "statement acct_bill_staging") {
		t.Fatalf("account statement from the CLI: %v\n%s", err, out)
	}
	if code, b := call(t, "GET", api.url+"/v1/admin/account-statements/cust_nobody?period="+period, admin, ""); code != 404 {
		t.Fatalf("an unknown account: %d %s", code, b)
	}

	for _, q := range []string{"period=2026-13", "period=2026-03&tz=Mars/Olympus", "period=1971-06&tz=Africa/Monrovia", "period=2026-03&verify=maybe", "period=2026-03&scope=x"} {
		if code, b := call(t, "GET", api.url+"/v1/admin/statements/acct_bill?"+q, admin, ""); code != 400 {
			t.Errorf("%s: %d %s, want 400", q, code, b)
		}
	}
	if code, _ := call(t, "GET", stURL, "", ""); code != 401 {
		t.Errorf("no token: %d", code)
	}
}

func waitBilling(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
