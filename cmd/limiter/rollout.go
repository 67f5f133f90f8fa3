package main

// A rollout of the policy log (policylog/rollout.go) in the limiter: while
// one is open, its candidate, with the overrides in force, is the shadow
// policy of every decision (enforcement/shadow's SetRollout), and the
// decision events carry the rollout's revision; /readyz's policy.rollout
// names it.

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/preview"
)

// rolloutInfo is /readyz's policy.rollout: the open rollout.
type rolloutInfo struct {
	// Revision is the rollout record's revision, the shadow revision the
	// decision events carry.
	Revision         int64     `json:"revision"`
	EndsAt           time.Time `json:"endsAt"`
	ShadowFor        string    `json:"shadowFor"`
	MaxNewlyRejected float64   `json:"maxNewlyRejected"`
	Author           string    `json:"author,omitempty"`
	Message          string    `json:"message,omitempty"`
}

// rolloutTarget is what follows the open rollout (the shadow evaluator).
type rolloutTarget interface {
	SetRollout(p enforcement.Policy, rev int64)
}

func rolloutInfoOf(st *policylog.State) *rolloutInfo {
	ro, ok := st.Rollout()
	if !ok {
		return nil
	}
	r := ro.Record
	return &rolloutInfo{Revision: r.Revision, EndsAt: r.Rollout.EndsAt, ShadowFor: r.Rollout.ShadowFor,
		MaxNewlyRejected: r.Rollout.MaxNewlyRejected, Author: r.Author, Message: r.Message}
}

// syncRollout gives the shadow evaluator the open rollout's candidate
// (again at every revision: the overrides may have changed), or ends the
// rollout's shadow. Run is its only caller after start.
func (t *policyTail) syncRollout() {
	if t.shadow == nil {
		return
	}
	st := t.client.State()
	ro, ok := st.Rollout()
	if !ok {
		if t.rolloutRev != 0 {
			t.shadow.SetRollout(nil, 0)
			t.logger.Info("rollout closed: its candidate is no longer evaluated in shadow", "rollout", t.rolloutRev, "revision", st.Head())
		}
		t.rolloutRev = 0
		return
	}
	t.shadow.SetRollout(st.CandidateSnapshot(nil), ro.Record.Revision)
	if t.rolloutRev != ro.Record.Revision {
		t.logger.Info("rollout open: every decision is also evaluated under its candidate (reported, never enforced)",
			"rollout", ro.Record.Revision, "ends_at", ro.Record.Rollout.EndsAt, "author", ro.Record.Author)
	}
	t.rolloutRev = ro.Record.Revision
}

// parseShare reads a share: "0.5%" or "0.005", from 0 to 1.
func parseShare(s string) (float64, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(t, "%"), 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a share (0.5%% or 0.005)", s)
	}
	if pct {
		v /= 100
	}
	if !(v >= 0 && v <= 1) {
		return 0, fmt.Errorf("%q is not a share from 0 to 100%%", s)
	}
	return v, nil
}

// reportRollout prints a rollout's outcome (as report does) and, once
// applied, when it ends.
func reportRollout(o policylog.Outcome, err error, pv *preview.Outcome, asJSON bool, stdout, stderr io.Writer) int {
	code := reportWith(o, err, pv, asJSON, stdout, stderr)
	if code == 0 && !asJSON && o.Record.Rollout != nil {
		fmt.Fprintf(stdout, "rollout %d: the candidate is the fleet's shadow policy until %s; then the judge promotes it if at most %s of the decisions are newly rejected, else withdraws it\n",
			o.Head, o.Record.Rollout.EndsAt.Format(time.RFC3339), policylog.FormatShare(o.Record.Rollout.MaxNewlyRejected))
	}
	return code
}
