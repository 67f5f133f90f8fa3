package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// reservePolicy with a bucket of 700 instead of 1000.
const tighterReservePolicy = `
version: 1
default_tier: llm
tiers:
  llm: { rate: 1, period: hour, burst: 700 }
`

// TestReplayDecidesAtActualCosts records reservations, settles and a
// charge of limiter processes on one Redis through the real
// meter-consumer (each request of the key on an instance that has not
// decided it before, so that the store decides every one), and replays them with `limiter policy
// replay`: the settles and the charge are rows of decisions_raw, and the
// replay spends them as the limiter did, so under the policy in force it
// reproduces the verdicts that only actual costs explain (a request let in
// by a settle's refund, a cost of 0 rejected in the debt a settle beyond
// its estimate made) and its actual cost is the rollups'. Under a tighter
// candidate the settles of the reservations it rejects change nothing.
func TestReplayDecidesAtActualCosts(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k, ch, db := startRecording(t, 4)
	env := []string{"REDIS_ADDRS=" + r.Addr(), "KAFKA_BROKERS=" + k.Addr(), "LIMITER_GRPC_ADDR=", storeDecides()}
	var p [5]*limiterProc
	for i := range p {
		p[i] = startLimiter(t, reservePolicy, env...)
	}
	from := time.Now().Add(-time.Minute).Truncate(time.Second)

	reserve := func(a *limiterProc, key string, est int, allowed bool) string {
		t.Helper()
		code, d := a.post(t, "/check", fmt.Sprintf(`{"key":%q,"scope":"llm:tokens","cost":%d,"reserve":true}`, key, est))
		id, _ := d["reservation"].(string)
		if code != 200 || d["allowed"] != allowed || (id != "") != allowed {
			t.Fatalf("reserve %d on %s: %d %v, want allowed=%v", est, key, code, d, allowed)
		}
		return id
	}
	settle := func(a *limiterProc, id string, actual int, remaining float64) {
		t.Helper()
		if code, s := a.post(t, "/settle", fmt.Sprintf(`{"reservation":%q,"cost":%d}`, id, actual)); code != 200 || s["remaining"] != remaining {
			t.Fatalf("settle at %d: %d %v, want %v remaining", actual, code, s, remaining)
		}
	}
	check := func(a *limiterProc, cost int, allowed bool) {
		t.Helper()
		if code, d := a.post(t, "/check", fmt.Sprintf(`{"key":"acct_tok","scope":"llm:tokens","cost":%d}`, cost)); code != 200 || d["allowed"] != allowed {
			t.Fatalf("check %d: %d %v, want allowed=%v", cost, code, d, allowed)
		}
	}
	id := reserve(p[0], "acct_tok", 800, true) // 1000 → 200
	settle(p[0], id, 100, 900)                 // the refund
	check(p[1], 500, true)                     // in only thanks to the refund → 400
	id = reserve(p[2], "acct_tok", 400, true)  // → 0
	settle(p[2], id, 1000, -600)               // beyond its estimate: debt
	check(p[3], 0, false)                      // a cost of 0 in debt
	if code, s := p[3].post(t, "/charge", `{"key":"acct_tok","scope":"llm:tokens","cost":200}`); code != 200 || s["remaining"] != -800.0 {
		t.Fatalf("charge: %d %v", code, s)
	}
	// On an instance of its own: p[3] learned the debt from its charge
	// and would reject this locally, with no store instant to order it
	// after the charge in the replay.
	reserve(p[4], "acct_tok", 1, false)
	reserve(p[0], "acct_exp", 300, true) // never settled: its estimate stands

	const actual = 800 + (100 - 800) + 500 + 400 + (1000 - 400) + 200 + 300
	testenv.WaitUsageTotals(t, ch.Conn(t), db, map[testenv.UsageKey]testenv.UsageTotal{
		{Key: "acct_tok", Scope: "llm:tokens"}: {Requests: 5, Allowed: 3, Rejected: 2, Cost: actual - 300},
		{Key: "acct_exp", Scope: "llm:tokens"}: {Requests: 1, Allowed: 1, Cost: 300},
	}, 60*time.Second)
	waitRaw(t, ch, db, 9) // 6 decisions, 2 settles, 1 charge
	to := time.Now().Add(time.Minute).Truncate(time.Second)
	chEnv := []string{"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db}

	same := runReplayBin(t, reservePolicy, chEnv, from, to)
	t.Logf("policy in force: %d rows, agreement %+v, total %+v, settlements %+v, actual cost %+v", same.Rows, same.Agreement, same.Total, same.Settlements, same.ActualCost)
	if same.Rows != 6 || same.Agreement.Compared == 0 || same.Agreement.DifferBeyondTolerance != 0 || same.Agreement.DifferWithinTolerance != 0 ||
		same.Total.NewlyRejected != 0 || same.Total.NewlyAllowed != 0 || same.Total.RecordedRejected != 2 {
		t.Fatalf("the policy in force does not reproduce the record: rows %d, %+v, %+v (%s)", same.Rows, same.Agreement, same.Total, same.FirstDifference)
	}
	if st := same.Settlements; st.Settles != 2 || st.SettlesUnmatched != 0 || st.Charges != 1 {
		t.Fatalf("settlements %+v, want 2 settles, both matched, and 1 charge", st)
	}
	if c := same.ActualCost; c.Recorded != actual || c.Replayed != actual {
		t.Fatalf("actual cost %+v, want %d recorded and replayed (the rollups')", c, actual)
	}

	tight := runReplayBin(t, tighterReservePolicy, chEnv, from, to)
	t.Logf("tighter: total %+v, settlements %+v, actual cost %+v", tight.Total, tight.Settlements, tight.ActualCost)
	// 800 > 700: rejected, its settle changes nothing; 500 in (700 → 200);
	// 400 rejected, its settle nothing; the cost of 0 allowed (no debt);
	// the charge → 0; 1 rejected; acct_exp's 300 in.
	if st := tight.Settlements; st.Settles != 2 || st.SettlesUnmatched != 2 || st.Charges != 1 {
		t.Fatalf("tighter: settlements %+v, want both settles unmatched", st)
	}
	if tight.Total.NewlyRejected != 2 || tight.Total.NewlyAllowed != 1 || tight.ActualCost.Replayed != 500+200+300 {
		t.Fatalf("tighter: total %+v, actual cost %+v; want 2 newly rejected, 1 newly allowed, 1000 spent", tight.Total, tight.ActualCost)
	}
	if table := replayTable(t, reservePolicy, chEnv, from, to); !strings.Contains(table, fmt.Sprintf("at actual costs: 2 settles (0 of a reservation the replay does not hold), 1 charges; tokens spent then %d, under the candidate %d", actual, actual)) {
		t.Fatalf("the table does not say what the settles and the charge cost:\n%s", table)
	}
}
