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

	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/preview"
)

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
