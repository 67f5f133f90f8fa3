package replay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement/replay"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
)

const current = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 3 }
rules:
  - { name: search, scope: "api:search", rate: 1, burst: 2 }
`

const tighter = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 3 }
rules:
  - { name: search, scope: "api:search", rate: 1, burst: 2 }
  - { name: k2-trial, key: k2, rate: 1, burst: 1 }
  - { name: trial-dry, key: k3, rate: 1, burst: 1, dry_run: true }
`

func engine(t *testing.T, y string) *replay.Engine {
	t.Helper()
	p, err := policy.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return replay.New(replay.Config{Policy: p, Tolerance: 10 * time.Millisecond})
}

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC).UnixMilli()

// row is a recorded shared decision at t0 + ms.
func row(ms int64, key, scope string, allowed bool) replay.Row {
	return replay.Row{TS: t0 + ms, Key: key, Scope: scope, Tier: "free", Cost: 1, Allowed: allowed, Source: "shared", Policy: "free"}
}

// The steps: a bucket of 3 at 1/s sees 4 requests within 3 ms (3 pass),
// then one a second later (a token is back).
func TestReplayUnderThePolicyInForceReproducesIt(t *testing.T) {
	e := engine(t, current)
	for _, k := range []string{"k1", "k2", "k3"} {
		for i, allowed := range []bool{true, true, true, false} {
			e.Add(row(int64(i), k, "web", allowed))
		}
		e.Add(row(1003, k, "web", true))
	}
	rep := e.Report()
	if rep.Rows != 15 || rep.Total.RecordedRejected != 3 || rep.Total.Rejected != 3 || rep.Total.NewlyRejected != 0 || rep.Total.NewlyAllowed != 0 {
		t.Fatalf("total %+v", rep.Total)
	}
	if ag := rep.Agreement; ag.Compared != 15 || ag.Agree != 15 {
		t.Fatalf("agreement %+v (%s)", ag, rep.FirstDifference)
	}
	if c := rep.Rules["free"]; c == nil || c.Decisions != 15 {
		t.Fatalf("rules %+v", rep.Rules)
	}
}

func TestReplayOfATighterPolicyNamesTheKeysItLimits(t *testing.T) {
	e := engine(t, tighter)
	for _, k := range []string{"k1", "k2", "k3"} {
		for i, allowed := range []bool{true, true, true, false} {
			e.Add(row(int64(i), k, "web", allowed))
		}
	}
	rep := e.Report()
	// k2 now has a bucket of 1: three rejections, two of them new.
	if c := rep.Rules["k2-trial"]; c.Decisions != 4 || c.Rejected != 3 || c.NewlyRejected != 2 || c.RecordedRejected != 1 {
		t.Fatalf("k2-trial %+v", c)
	}
	// k3's trial is dry run: it would reject 3 and rejects nothing.
	if c := rep.Rules["trial-dry"]; c.Rejected != 0 || c.DryRunWouldReject != 3 || c.NewlyAllowed != 1 {
		t.Fatalf("trial-dry %+v", c)
	}
	if len(rep.TopKeys) == 0 || rep.TopKeys[0].Key != "k2" {
		t.Fatalf("top keys %+v", rep.TopKeys)
	}
	k2 := rep.TopKeys[0]
	if want := time.UnixMilli(t0 + 1).UTC(); !k2.FirstLimited.Equal(want) {
		t.Fatalf("k2 first limited %v, want %v (its second request)", k2.FirstLimited, want)
	}
	if want := time.UnixMilli(t0 + 3).UTC(); !k2.FirstRecordedLimited.Equal(want) {
		t.Fatalf("k2 first limited then %v, want %v", k2.FirstRecordedLimited, want)
	}
}

// A recorded decision a few ms from a bucket boundary may go the other way
// in the replay (the recorded time is the limiter's ms, the store decided a
// moment later): within the tolerance that is clock granularity.
func TestAgreementSeparatesClockGranularityFromDifferences(t *testing.T) {
	e := engine(t, current)
	e.Add(row(0, "k", "web", true))
	e.Add(row(0, "k", "web", true))
	e.Add(row(0, "k", "web", true))
	// 997 ms later 0.997 tokens are back: the replay rejects, 3 ms short;
	// the store, deciding a few ms after the recorded time, allowed.
	e.Add(row(997, "k", "web", true))
	// A different key, rejected then, but a full bucket now: a difference.
	e.Add(row(2000, "other", "web", false))
	ag := e.Report().Agreement
	if ag.Compared != 5 || ag.Agree != 3 || ag.DifferWithinClock != 1 || ag.DifferBeyondClock != 1 {
		t.Fatalf("agreement %+v", ag)
	}
}

// A candidate that does not define a recorded tier would refuse those
// requests outright.
func TestUnknownTierIsRejected(t *testing.T) {
	e := engine(t, current)
	r := row(0, "k", "web", true)
	r.Tier = "gold"
	e.Add(r)
	if c := e.Report().Rules["(unknown tier)"]; c == nil || c.Rejected != 1 {
		t.Fatalf("rules %+v", e.Report().Rules)
	}
}

// BenchmarkReplay is the replay's own speed (rows decided per second, no
// ClickHouse): 10,000 keys over 3 scopes, rows 100 µs apart in time.
func BenchmarkReplay(b *testing.B) {
	p, err := policy.Parse([]byte(tighter))
	if err != nil {
		b.Fatal(err)
	}
	rows := make([]replay.Row, 1<<16)
	scopes := []string{"web", "api:search", "api:read"}
	for i := range rows {
		k := fmt.Sprintf("k%d", (i*7919)%10000)
		rows[i] = replay.Row{Key: k, Scope: scopes[i%3], Tier: "free", Cost: 1, Allowed: true, Source: "shared"}
	}
	e := replay.New(replay.Config{Policy: p})
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), proccpu.Self()
	for i := 0; i < b.N; i++ {
		r := rows[i&(len(rows)-1)]
		r.TS = t0 + int64(i)/10
		e.Add(r)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
	// CPU time: what one core replays, whatever else the machine runs.
	b.ReportMetric(float64(b.N)/(proccpu.Self()-cpu0).Seconds(), "rows/cpu-s")
}

// A row that carries the store's instant (DecidedUS) is decided at it, not
// at TS: here the limiter's clock said 0 ms for a request the store decided
// 600 ms later, after a token came back (bucket of 3 at 1/s, emptied at
// 400 ms). At TS it would be a rejection 400 ms from the boundary, beyond
// any tolerance; at the store's instant it is the allowed decision that was
// recorded.
func TestReplayDecidesAtTheStoresInstant(t *testing.T) {
	at := func(ms int64) int64 { return (t0 + ms) * 1000 }
	rows := func(decided bool) []replay.Row {
		rs := []replay.Row{row(400, "k", "web", true), row(400, "k", "web", true), row(400, "k", "web", true), row(0, "k", "web", true)}
		if decided {
			for i, us := range []int64{at(400), at(400) + 1, at(400) + 2, at(1400) + 3} {
				rs[i].DecidedUS = us
			}
		}
		return rs
	}
	with := engine(t, current)
	for _, r := range rows(true) {
		with.Add(r)
	}
	if ag := with.Report().Agreement; ag.Compared != 4 || ag.Agree != 4 {
		t.Fatalf("with the store's instants: %+v, want all 4 reproduced", ag)
	}
	without := engine(t, current)
	for _, r := range rows(false) {
		without.Add(r)
	}
	if ag := without.Report().Agreement; ag.DifferBeyondClock != 1 {
		t.Fatalf("at the limiter's clock: %+v, want the last one to differ beyond the tolerance", ag)
	}
}

// TopNewlyRejected lists only the keys the candidate newly rejects, the
// most first, ahead of keys it rejects more but only as they were then.
func TestTopNewlyRejectedRanksByChange(t *testing.T) {
	p, err := policy.Parse([]byte(tighter))
	if err != nil {
		t.Fatal(err)
	}
	e := replay.New(replay.Config{Policy: p, TopNewlyRejected: true})
	// k1: 6 requests, 3 rejected then and now (no change); k2: 3 allowed
	// then, the candidate's bucket of 1 rejects 2 of them.
	for i := range 6 {
		e.Add(row(int64(i), "k1", "web", i < 3))
	}
	for i := range 3 {
		e.Add(row(int64(i), "k2", "web", true))
	}
	rep := e.Report()
	if len(rep.TopKeys) != 1 || rep.TopKeys[0].Key != "k2" || rep.TopKeys[0].NewlyRejected != 2 {
		t.Fatalf("top keys %+v, want k2 alone with 2 newly rejected", rep.TopKeys)
	}
	if rep.Total.NewlyRejected != 2 || rep.Rules["k2-trial"].NewlyRejected != 2 {
		t.Fatalf("total %+v rules %+v", rep.Total, rep.Rules)
	}
}

// A bucket of 100 tokens refilling one an hour (nothing refills here).
const tokens = `
version: 1
default_tier: llm
tiers:
  llm: { rate: 1, period: hour, burst: 100 }
`

const tighterTokens = `
version: 1
default_tier: llm
tiers:
  llm: { rate: 1, period: hour, burst: 60 }
`

// tokenRows is a recorded key whose verdicts follow from actual costs: a
// settle's refund lets a later request in, a settle beyond its estimate
// and a charge put the bucket in debt, which rejects even a cost of 0 and
// a reservation; then the refill is far away.
func tokenRows() []replay.Row {
	d := func(ms, cost int64, allowed bool, reservation string) replay.Row {
		r := replay.Row{TS: t0 + ms, Key: "acct", Scope: "llm:tokens", Tier: "llm", Cost: cost, Allowed: allowed, Source: "shared", Policy: "llm",
			Reservation: reservation, DecidedUS: (t0+ms)*1000 + 300}
		if reservation != "" {
			r.Kind = replay.KindDecision
		}
		return r
	}
	s := func(ms int64, kind, reservation string, estimate, actual int64) replay.Row {
		return replay.Row{TS: t0 + ms, Key: "acct", Scope: "llm:tokens", Tier: "llm", Allowed: true, Source: "shared", Policy: "llm",
			Kind: kind, Reservation: reservation, Estimate: estimate, Actual: actual, DecidedUS: (t0+ms)*1000 + 300}
	}
	return []replay.Row{
		d(0, 80, true, "r1"),                   // 100 → 20
		s(1, replay.KindSettle, "r1", 80, 10),  // refund 70 → 90
		d(2, 50, true, ""),                     // allowed thanks to the refund → 40
		d(3, 40, true, "r2"),                   // → 0
		s(4, replay.KindSettle, "r2", 40, 100), // → −60: debt
		d(5, 0, false, ""),                     // cost 0 in debt: rejected
		s(6, replay.KindCharge, "", 0, 30),     // → −90
		d(7, 5, false, ""),                     // a reservation in debt: rejected, no id
	}
}

// Settles and charges are replayed at their actual costs: under the policy
// in force every recorded verdict is reproduced (refund and debt
// included), they are counted apart from the decisions, and the actual
// cost replayed is the recorded one. Under a tighter candidate, the
// settles of reservations it rejects change nothing, and the request the
// recorded debt rejected is newly allowed.
func TestReplayAppliesSettlesAndChargesAtTheirActualCosts(t *testing.T) {
	e := engine(t, tokens)
	rows := tokenRows()
	for _, r := range rows {
		e.Add(r)
	}
	rep := e.Report()
	if rep.Rows != 5 || rep.Total.Decisions != 5 || rep.Agreement.Compared != 5 || rep.Agreement.Agree != 5 {
		t.Fatalf("under the policy in force: rows %d, agreement %+v (%s), want 5 decisions, all reproduced", rep.Rows, rep.Agreement, rep.FirstDifference)
	}
	if rep.Settlements != (replay.Settlements{Settles: 2, Charges: 1}) {
		t.Fatalf("settlements %+v, want 2 settles and a charge, all matched", rep.Settlements)
	}
	if want := int64(80 + 10 - 80 + 50 + 40 + 100 - 40 + 30); rep.ActualCost != (replay.ActualCost{Recorded: want, Replayed: want}) {
		t.Fatalf("actual cost %+v, want %d both", rep.ActualCost, want)
	}

	tight := engine(t, tighterTokens)
	for _, r := range rows {
		tight.Add(r)
	}
	rep = tight.Report()
	// 80 > the bucket of 60: rejected, its settle unmatched; 50 allowed
	// (60 → 10); the reservation of 40 rejected, its settle unmatched; the
	// cost 0 allowed (10 left, no debt); the charge → −20; 5 rejected.
	if rep.Settlements != (replay.Settlements{Settles: 2, Unmatched: 2, Charges: 1}) {
		t.Fatalf("tighter: settlements %+v, want both settles unmatched", rep.Settlements)
	}
	if rep.Total.NewlyRejected != 2 || rep.Total.NewlyAllowed != 1 || rep.ActualCost.Replayed != 50+30 {
		t.Fatalf("tighter: total %+v, actual cost %+v; want 2 newly rejected, 1 newly allowed, 80 replayed", rep.Total, rep.ActualCost)
	}
}

// A candidate whose limit is a concurrency alone has no rate to refuse the
// recorded decisions by: it allows them all (in-flight counts are not in
// the record), where a tighter rate would have rejected some.
func TestReplayOfAConcurrencyAloneAllows(t *testing.T) {
	e := engine(t, "version: 1\ndefault_tier: free\ntiers:\n  free: { concurrency: 2 }\n")
	for i, allowed := range []bool{true, true, true, false} {
		e.Add(row(int64(i), "k1", "web", allowed))
	}
	rep := e.Report()
	if rep.Total.Rejected != 0 || rep.Total.NewlyAllowed != 1 || rep.Total.Decisions != 4 {
		t.Fatalf("total %+v", rep.Total)
	}
}

// TestReplayResetsTheQuotaAtAResetRow: a quota of 2 spent, rejected, reset
// by support, then spent again: the replay decides each request as
// recorded, and a tier without a quota has nothing to reset.
func TestReplayResetsTheQuotaAtAResetRow(t *testing.T) {
	e := engine(t, `
version: 1
default_tier: free
tiers:
  free: { rate: 100, burst: 100, quota: { limit: 2, period: month } }
`)
	steps := []replay.Row{
		row(0, "q", "api", true), row(1, "q", "api", true), row(2, "q", "api", false),
		{TS: t0 + 3, Key: "q", Scope: "api", Tier: "free", Kind: "reset", Reservation: "rs_1"},
		row(4, "q", "api", true), row(5, "q", "api", true), row(6, "q", "api", false),
	}
	for _, r := range steps {
		e.Add(r)
	}
	rep := e.Report()
	if rep.Rows != 6 || rep.QuotaResets != 1 || rep.Total.Rejected != 2 || rep.Total.NewlyRejected != 0 || rep.Total.NewlyAllowed != 0 {
		t.Fatalf("rows %d, resets %d, total %+v (%s)", rep.Rows, rep.QuotaResets, rep.Total, rep.FirstDifference)
	}
	noQuota := engine(t, current)
	noQuota.Add(replay.Row{TS: t0, Key: "q", Scope: "web", Tier: "free", Kind: "reset"})
	if r := noQuota.Report(); r.QuotaResets != 0 || r.Rows != 0 {
		t.Fatalf("a reset under a limit without quota: %+v", r)
	}
}

// classes is current with priority classes: sheddable may spend down to
// half of a bucket, default to a fifth.
const classes = `
version: 1
default_tier: free
priorities: { critical: 1, default: 0.8, sheddable: 0.5 }
tiers:
  free: { rate: 0.001, burst: 10 }
`

// TestReplayDecidesEachRowWithItsClass: rows carry the request's priority
// class, and a candidate with classes decides each with its class's share
// of the bucket, as the limiter did (the sheds recorded are reproduced);
// a candidate without them allows what was shed; one without the row's
// class would refuse it.
func TestReplayDecidesEachRowWithItsClass(t *testing.T) {
	var rows []replay.Row
	add := func(priority string, allowed bool) {
		r := row(int64(len(rows)), "acct", "web", allowed)
		r.Priority = priority
		rows = append(rows, r)
	}
	for range 5 {
		add("sheddable", true)
	}
	add("sheddable", false) // shed: 5 of 10 left
	for range 3 {
		add("", true)
	}
	add("default", false) // shed: 2 of 10 left
	add("critical", true)
	add("critical", true)

	same := engine(t, classes)
	for _, r := range rows {
		same.Add(r)
	}
	if rep := same.Report(); rep.Agreement.Agree != 12 || rep.Total.NewlyRejected != 0 || rep.Total.NewlyAllowed != 0 || rep.Total.Rejected != 2 {
		t.Fatalf("under the classes in force: %+v, agreement %+v", rep.Total, rep.Agreement)
	}

	none := engine(t, "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 0.001, burst: 10 }\n")
	for _, r := range rows {
		r.Priority = ""
		none.Add(r)
	}
	if rep := none.Report(); rep.Total.NewlyAllowed != 2 || rep.Total.NewlyRejected != 2 {
		t.Fatalf("without classes the two sheds are allowed and the bucket runs out two requests later: %+v", rep.Total)
	}

	other := engine(t, "version: 1\ndefault_tier: free\npriorities: { default: 1, batch: 0.5 }\ntiers:\n  free: { rate: 0.001, burst: 10 }\n")
	for _, r := range rows {
		other.Add(r)
	}
	rep := other.Report()
	if c := rep.Rules["(unknown priority class)"]; c == nil || c.Decisions != 8 || c.Rejected != 8 {
		t.Fatalf("rows of classes the candidate does not define: %+v", rep.Rules)
	}
}
