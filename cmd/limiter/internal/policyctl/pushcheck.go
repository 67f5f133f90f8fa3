package policyctl

// Before `limiter policy push` writes, it replays the last hour of
// recorded traffic (ClickHouse decisions_raw) under the candidate — the
// pushed document with the overrides in force — and prints what it would
// newly reject (policylog/preview). The preview informs; it never blocks a
// push: with ClickHouse unreachable or not set up it says so on stderr and
// the push goes on, and its whole cost (connection, count, scan) is bounded
// by --replay-timeout and --replay-max-rows.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/preview"
	"github.com/ratewarden/ratewarden/schema"
)

// pushPreviewArgs are push's flags of the preview.
type pushPreviewArgs struct {
	off     *bool
	window  *time.Duration
	maxRows *int64
	timeout *time.Duration
}

func addPushPreviewFlags(f *flag.FlagSet) pushPreviewArgs {
	return pushPreviewArgs{
		off:     f.Bool("no-replay", false, "push without replaying recorded traffic first"),
		window:  f.Duration("replay-window", time.Hour, "replay the decisions recorded over this last span"),
		maxRows: f.Int64("replay-max-rows", 500_000, "row budget of the replay: beyond it keys are sampled, then the replay stops"),
		timeout: f.Duration("replay-timeout", 20*time.Second, "deadline of the whole replay (connection, queries, replay); the push goes on after it"),
	}
}

// problem is what is wrong with the flags ("" = nothing).
func (a pushPreviewArgs) problem() string {
	switch {
	case *a.window <= 0:
		return "--replay-window must be positive"
	case *a.maxRows <= 0:
		return "--replay-max-rows must be positive"
	case *a.timeout <= 0:
		return "--replay-timeout must be positive"
	}
	return ""
}

// previewPush replays recorded traffic under doc with the overrides in
// force in st, printing the outcome (on stdout unless asJSON; a preview
// that could not run is said on stderr either way). It never fails a push.
func previewPush(ctx context.Context, a pushPreviewArgs, doc *policy.Policy, st *policylog.State, asJSON bool, getenv func(string) string, stdout, stderr io.Writer) *preview.Outcome {
	if *a.off {
		return &preview.Outcome{Status: preview.Skipped, Reason: "--no-replay"}
	}
	unavailable := func(why string) *preview.Outcome {
		fmt.Fprintf(stderr, "replay skipped: %s; pushing without a preview (--no-replay skips this step)\n", why)
		return &preview.Outcome{Status: preview.Unavailable, Reason: why}
	}
	env := envconfig.New(getenv)
	ch := chconn.FromEnv(env, schema.ValidDatabase)
	if err := env.Err(); err != nil {
		return unavailable("ClickHouse is not configured: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, *a.timeout)
	defer cancel()
	// A short dial and per-read deadline under the whole one: an address
	// that accepts and never answers costs a few seconds, not the push.
	conn, err := ch.Open(chconn.Tuning{DialTimeout: min(3*time.Second, *a.timeout), ReadTimeout: *a.timeout})
	if err != nil {
		return unavailable(err.Error())
	}
	defer conn.Close()
	if err := conn.Ping(ctx); err != nil {
		return unavailable(fmt.Sprintf("ClickHouse unreachable at %s: %v", ch.Addr, err))
	}
	ov := policy.NewOverrides(0)
	if snap := st.Snapshot(nil); snap != nil {
		ov = snap.Overrides()
	}
	candidate := policy.NewWithOverrides(doc, ov, nil)
	res, err := preview.Run(ctx, conn, preview.Config{Database: ch.Database, Window: *a.window, MaxRows: *a.maxRows}, candidate, time.Now())
	if err != nil {
		return unavailable(fmt.Sprintf("cannot replay %s.decisions_raw at %s: %v", ch.Database, ch.Addr, err))
	}
	if !asJSON {
		writePreview(stdout, res, *a.window)
	}
	return &preview.Outcome{Status: preview.Replayed, Result: &res}
}

func writePreview(w io.Writer, r preview.Result, window time.Duration) {
	fmt.Fprintf(w, "replay of the last %s of recorded traffic under the candidate (%d decisions in %.1f s):\n", window, r.Decisions, r.Seconds)
	fmt.Fprintln(w, "  "+r.Summary())
	if r.Sample < 1 {
		fmt.Fprintf(w, "  sampled: %.4g of keys (by key hash) of %d recorded rows, to stay within --replay-max-rows\n", r.Sample, r.Recorded)
	}
	if r.Capped {
		fmt.Fprintf(w, "  capped: the row budget stopped the replay; decisions after %s are not in it\n", r.CoveredTo.Format(time.RFC3339))
	}
	if r.Partial {
		fmt.Fprintf(w, "  partial: --replay-timeout stopped the replay; decisions after %s are not in it\n", r.CoveredTo.Format(time.RFC3339))
	}
	if r.NewlyRejected == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  rule\tdecisions\tnewly rejected")
	for _, c := range r.Rules {
		fmt.Fprintf(tw, "  %s\t%d\t%d\n", c.Name, c.Decisions, c.NewlyRejected)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  key\tdecisions\tnewly rejected\tfirst limited now")
	for _, k := range r.TopKeys {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", k.Key, k.Decisions, k.NewlyRejected, when(k.FirstLimited))
	}
	tw.Flush()
}

// checkWriterStores is the writer's check of the stores a write routes
// keys to (names, each with where it is named) against its own
// REDIS_STORES. The log cannot refuse them (its apply rule is the same on
// every limiter, whatever stores each has), so this is where a typo is
// caught: with REDIS_STORES set, a name it lacks refuses the write; unset,
// the writer cannot tell and warns. A limiter lacking a store decides its
// keys degraded (docs/policy-log.md, "Named stores in the log").
func checkWriterStores(names map[string]string, getenv func(string) string, stderr io.Writer) bool {
	if len(names) == 0 {
		return true
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	raw := getenv("REDIS_STORES")
	if raw == "" {
		for _, name := range sorted {
			where := names[name]
			fmt.Fprintf(stderr, "warning: %s routes keys to store %q; REDIS_STORES is not set here, so it is not checked (a limiter without that store decides those keys degraded)\n", where, name)
		}
		return true
	}
	known, err := redisclient.StoresOfEnv(getenv, limits.ValidStoreName)
	if err != nil {
		fmt.Fprintln(stderr, "refused: invalid configuration: "+err.Error())
		return false
	}
	ok := true
	for _, name := range sorted {
		if where := names[name]; known[name] == nil {
			fmt.Fprintf(stderr, "refused: %s routes keys to store %q, which REDIS_STORES does not name (a limiter without it decides those keys degraded; unset REDIS_STORES to push without this check)\n", where, name)
			ok = false
		}
	}
	return ok
}

// documentStores is every store doc routes keys to, with where.
func documentStores(doc *policy.Policy) map[string]string {
	out := map[string]string{}
	for name, t := range doc.File().Tiers {
		if t.Store != "" {
			out[t.Store] = "tiers." + name + ".store"
		}
	}
	for key, st := range doc.File().KeyStores {
		out[st] = "keys." + key + ".store"
	}
	return out
}
