package policyctl

// `limiter policy push --shadow-for D --max-newly-rejected P` opens a
// rollout of the policy log (policylog/rollout.go): its bound, and what it
// prints once applied.

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

// rolloutBound reads push's rollout flags, which go together: neither is
// a plain push (bound 0); otherwise --shadow-for must be above 0 and at
// most policylog.MaxShadowFor, and --max-newly-rejected a share.
func rolloutBound(shadowFor time.Duration, maxNewly string) (float64, error) {
	if shadowFor == 0 && maxNewly == "" {
		return 0, nil
	}
	bound, err := parseShare(maxNewly)
	if err != nil || shadowFor <= 0 || shadowFor > policylog.MaxShadowFor {
		return 0, fmt.Errorf("a rollout needs --shadow-for (above 0, at most %s) and --max-newly-rejected (a share such as 0.5%%)", policylog.MaxShadowFor)
	}
	return bound, nil
}

// reportRollout prints a rollout's outcome (as the gate's report does)
// and, once applied, when it ends.
func reportRollout(g *writeGate, c *policylog.Client, o policylog.Outcome, err error, pv *preview.Outcome, asJSON bool, stdout, stderr io.Writer) int {
	code := g.report(c, o, err, pv, asJSON, stdout, stderr)
	if code == 0 && !asJSON && o.Record.Rollout != nil {
		fmt.Fprintf(stdout, "rollout %d: the candidate is the fleet's shadow policy until %s; then the judge promotes it if at most %s of the decisions are newly rejected, else withdraws it\n",
			o.Head, o.Record.Rollout.EndsAt.Format(time.RFC3339), policylog.FormatShare(o.Record.Rollout.MaxNewlyRejected))
	}
	return code
}
