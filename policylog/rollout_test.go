package policylog_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

func rollout(rev, parent int64, yaml string) policylog.Record {
	r := policylog.Record{Revision: rev, Parent: parent, Kind: policylog.KindRollout, Author: "ops", Message: "try it", Time: t0, Document: yaml,
		Rollout: &policylog.Rollout{ShadowFor: "15m0s", EndsAt: t0.Add(15 * time.Minute), MaxNewlyRejected: 0.005}}
	r.Seal()
	return r
}

func verdict(rev, parent, of int64, decision, yaml, judge string) policylog.Record {
	r := policylog.Record{Revision: rev, Parent: parent, Kind: policylog.KindVerdict, Author: judge, Message: "time is up", Time: t0,
		Verdict: &policylog.Verdict{Rollout: of, Decision: decision, Decisions: 1000, NewlyRejected: 1, Share: 0.001, MaxNewlyRejected: 0.005}}
	if decision == policylog.Promote {
		r.Document = yaml
	}
	r.Seal()
	return r
}

// TestRolloutApplyRule steps through the rollout part of the apply rule:
// one verdict per rollout, a push supersedes an open rollout, a promote
// makes the candidate the document in force, a withdraw leaves it.
func TestRolloutApplyRule(t *testing.T) {
	steps := []struct {
		r          policylog.Record
		result     string
		code       string
		reason     string // substring
		freeRate   float64
		open       int64 // the open rollout after the step (0 = none)
		superseded int64
	}{
		{r: rollout(1, 0, docB), result: policylog.Refused, code: policylog.CodeInvalid, reason: "no policy document yet"},
		{r: doc(1, 0, docA, "alice"), result: policylog.Applied, freeRate: 10},
		{r: rollout(2, 1, docB), result: policylog.Applied, freeRate: 10, open: 2},
		{r: rollout(3, 2, docB), result: policylog.Refused, code: policylog.CodeInvalid, reason: "rollout 2 is open", freeRate: 10, open: 2},
		{r: ovr(3, 2, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"}), result: policylog.Applied, freeRate: 10, open: 2},
		{r: verdict(4, 3, 2, policylog.Promote, docB, "judge-a"), result: policylog.Applied, freeRate: 11},
		// The racing judge's verdict, written on the new head: refused.
		{r: verdict(5, 4, 2, policylog.Withdraw, "", "judge-b"), result: policylog.Refused, code: policylog.CodeConflict,
			reason: "rollout 2 was already closed at revision 4 by judge-a", freeRate: 11},
		// A rollout whose candidate drops a tier an override uses.
		{r: rollout(5, 4, docNoPro), result: policylog.Refused, code: policylog.CodeInvalid, reason: "drops tiers", freeRate: 11},
		{r: rollout(5, 4, docA), result: policylog.Applied, freeRate: 11, open: 5},
		{r: doc(6, 5, docB+"# fix\n", "bob"), result: policylog.Applied, freeRate: 11, superseded: 5},
		{r: verdict(7, 6, 5, policylog.Promote, docA, "judge-a"), result: policylog.Refused, code: policylog.CodeConflict,
			reason: "rollout 5 was already closed at revision 6 by bob", freeRate: 11},
		{r: rollout(7, 6, docA), result: policylog.Applied, freeRate: 11, open: 7},
		{r: verdict(8, 7, 7, policylog.Withdraw, "", "judge-a"), result: policylog.Applied, freeRate: 11},
		{r: verdict(9, 8, 7, policylog.Withdraw, "", "judge-a"), result: policylog.Refused, code: policylog.CodeConflict, reason: "already closed", freeRate: 11},
	}
	s := policylog.NewState(true)
	for i, st := range steps {
		o := s.Apply(entry(int64(i), st.r))
		if o.Result != st.result || o.Code != st.code || !strings.Contains(o.Reason, st.reason) || o.Superseded != st.superseded {
			t.Fatalf("step %d (%s): %s %s %q superseded %d; want %s %s %q superseded %d", i, st.r.Subject(), o.Result, o.Code, o.Reason, o.Superseded,
				st.result, st.code, st.reason, st.superseded)
		}
		var open int64
		if ro, ok := s.Rollout(); ok {
			open = ro.Record.Revision
			if ro.Candidate == nil {
				t.Fatalf("step %d: open rollout without a candidate", i)
			}
		}
		if open != st.open {
			t.Fatalf("step %d: open rollout %d, want %d", i, open, st.open)
		}
		if st.freeRate != 0 {
			res, err := s.Snapshot(nil).Resolve("k", "s", "")
			if err != nil || res.Limit.Rate != st.freeRate {
				t.Fatalf("step %d: free rate %v (%v), want %v", i, res.Limit.Rate, err, st.freeRate)
			}
		}
	}
	if h, ok := (func() (policylog.Meta, bool) { return s.ClosedBy(2) })(); !ok || h.Author != "judge-a" {
		t.Errorf("rollout 2 closed by %+v", h)
	}
}

// TestRolloutRecordsDecode: a verdict filed under the wrong log key, or
// with an unknown decision, is garbled.
func TestRolloutRecordsDecode(t *testing.T) {
	p := verdict(4, 3, 2, policylog.Promote, docB, "j")
	if p.LogKey() != policylog.DocumentKey {
		t.Fatalf("a promote is filed under %q", p.LogKey())
	}
	w := verdict(4, 3, 2, policylog.Withdraw, "", "j")
	if w.LogKey() != policylog.RolloutKey {
		t.Fatalf("a withdraw is filed under %q", w.LogKey())
	}
	b, _ := p.Encode()
	if _, err := policylog.Decode(policylog.RolloutKey, b); err == nil {
		t.Error("a promote under log key rollout decoded")
	}
	bad := verdict(4, 3, 2, "maybe", "", "j")
	b, _ = bad.Encode()
	if _, err := policylog.Decode(policylog.RolloutKey, b); err == nil || !strings.Contains(err.Error(), "not promote or withdraw") {
		t.Errorf("an unknown decision: %v", err)
	}
	tampered := w
	tampered.Verdict = &policylog.Verdict{Rollout: 2, Decision: policylog.Withdraw, Share: 0.9}
	b, _ = tampered.Encode()
	if _, err := policylog.Decode(policylog.RolloutKey, b); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("a verdict changed after sealing: %v", err)
	}
}

type rolloutView struct {
	view
	Open int64
}

func rolloutViewOf(s *policylog.State) rolloutView {
	v := rolloutView{view: viewOf(s)}
	if ro, ok := s.Rollout(); ok {
		v.Open = ro.Record.Revision
	}
	return v
}

// TestCompactedRolloutsReplayToSameState: a log of rollouts, verdicts
// (one refused), pushes that supersede, every prefix compacted: the same
// document, overrides and open rollout as the full log.
func TestCompactedRolloutsReplayToSameState(t *testing.T) {
	pro := &policy.Override{Tier: "pro", Reason: "upgrade"}
	docC := docB + "# candidate C\n" // keeps gold, which acct_2 uses
	for _, tail := range [][]policylog.Record{
		{},                    // rollout 6 promoted, then an override
		{rollout(8, 7, docC)}, // a rollout left open
		{rollout(8, 7, docC), doc(9, 8, docC+"# fix\n", "bob")},                                    // superseded
		{rollout(8, 7, docC), verdict(9, 8, 8, policylog.Withdraw, "", "j")},                       // withdrawn
		{rollout(8, 7, docC), verdict(9, 8, 8, policylog.Withdraw, "", "j"), rollout(10, 9, docC)}, // withdrawn, another open
	} {
		recs := append([]policylog.Record{
			doc(1, 0, docA, "alice"),
			rollout(2, 1, docB),
			ovr(3, 2, "acct_1", "", pro),
			verdict(4, 3, 2, policylog.Withdraw, "", "j"),
			rollout(5, 4, docB),
			verdict(6, 5, 5, policylog.Promote, docB, "j"),
			// A second judge raced for revision 6: refused, and it restated
			// the record in force of the log key it wrote under.
			verdict(6, 5, 5, policylog.Withdraw, "", "j2"),
			restated(rollout(5, 4, docB), verdict(6, 5, 5, policylog.Withdraw, "", "j2")),
			ovr(7, 6, "acct_2", "", &policy.Override{Tier: "gold", Reason: "only in docB"}),
		}, tail...)
		full := policylog.NewState(true)
		var entries []policylog.Entry
		for i, r := range recs {
			e := entry(int64(i), r)
			entries = append(entries, e)
			full.Apply(e)
		}
		want := rolloutViewOf(full)
		last := map[string]int{}
		for i, e := range entries {
			last[e.Key] = i
		}
		for j := range entries {
			partial := policylog.NewState(true)
			for i, e := range entries {
				if i >= j || last[e.Key] == i {
					partial.Apply(e)
				}
			}
			if got := rolloutViewOf(partial); !reflect.DeepEqual(got, want) {
				t.Errorf("tail of %d: compacted before offset %d:\n got %+v\nwant %+v", len(tail), j, got, want)
			}
		}
	}
}
