package policyctl

// `limiter override set|get|list|delete`: per-key overrides written to
// and read from the policy log.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

const overrideUsage = `usage:
  limiter override set KEY [--scope S] [--tier T] [--rate R --burst B [--period P]] [--quota N --quota-period P] [--expires RFC3339|DURATION] --reason TEXT [--author A] [--store NAME] [--json]
  limiter override get KEY [--scope S] [--json]
  limiter override list [--json]
  limiter override delete KEY [--scope S] --reason TEXT [--author A] [--json]`

// OverrideSet is `limiter override set KEY ...`: a key's (or key and
// scope's) override, ahead of every rule. A named --store is checked
// against the writer's REDIS_STORES before anything is written.
func OverrideSet(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter override set", overrideUsage, stdout, stderr)
	asJSON := f.Bool("json", false, "print JSON")
	scope := f.scopeFlag()
	tier := f.String("tier", "", "tier (instead of rate and burst)")
	rate := f.Float64("rate", 0, "tokens per period")
	burst := f.Int64("burst", 0, "bucket capacity")
	period := f.String("period", "", "of rate: second (default), minute, hour, day")
	quota := f.Int64("quota", 0, "calendar quota")
	quotaPeriod := f.String("quota-period", "", "hour, day or month")
	expires := f.String("expires", "", "RFC 3339 instant, or a duration from now (72h)")
	store := f.String("store", "", "named store (dedicated capacity)")
	reason := f.reasonFlag()
	author := f.authorFlag()
	if code, ok := f.parseWords(args, 1, 1); !ok {
		return code
	}
	o := policy.Override{Tier: *tier, Rate: *rate, Burst: *burst, Period: *period, Quota: *quota, QuotaPeriod: *quotaPeriod, Reason: *reason, Store: *store}
	if *expires != "" {
		t, err := parseExpiry(*expires, time.Now())
		if err != nil {
			return f.usageError(err.Error())
		}
		o.Expires = t
	}
	if o.Store != "" && !checkWriterStores(map[string]string{o.Store: "the override of " + f.args[0]}, os.Getenv, stderr) {
		return 1
	}
	return withLogWrite(stderr, func(ctx context.Context, c *policylog.Client, g *writeGate) int {
		out, err := c.SetOverride(ctx, f.args[0], *scope, o, *author, "", policylog.NoExpect)
		return g.report(c, out, err, nil, *asJSON, stdout, stderr)
	})
}

// OverrideGet is `limiter override get KEY ...`: the override in force
// for a key (and scope); none is exit 1.
func OverrideGet(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter override get", overrideUsage, stdout, stderr)
	asJSON := f.Bool("json", false, "print JSON")
	scope := f.scopeFlag()
	if code, ok := f.parseWords(args, 1, 1); !ok {
		return code
	}
	return withLog(stderr, false, func(_ context.Context, c *policylog.Client) int {
		r, ok := c.State().Override(f.args[0], *scope)
		if !ok {
			fmt.Fprintf(stderr, "no override of %s\n", (&policylog.Record{Kind: policylog.KindOverride, Key: f.args[0], Scope: *scope}).Subject())
			return 1
		}
		printOverrides(stdout, []policylog.Record{r}, *asJSON)
		return 0
	})
}

// OverrideList is `limiter override list`: every override in force.
func OverrideList(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter override list", overrideUsage, stdout, stderr)
	asJSON := f.Bool("json", false, "print JSON")
	if code, ok := f.parseWords(args, 0, 0); !ok {
		return code
	}
	return withLog(stderr, false, func(_ context.Context, c *policylog.Client) int {
		printOverrides(stdout, c.State().OverrideRecords(), *asJSON)
		return 0
	})
}

// OverrideDelete is `limiter override delete KEY ...`: a tombstone for the
// key's (or key and scope's) override.
func OverrideDelete(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter override delete", overrideUsage, stdout, stderr)
	asJSON := f.Bool("json", false, "print JSON")
	scope := f.scopeFlag()
	reason := f.reasonFlag()
	author := f.authorFlag()
	if code, ok := f.parseWords(args, 1, 1); !ok {
		return code
	}
	return withLogWrite(stderr, func(ctx context.Context, c *policylog.Client, g *writeGate) int {
		out, err := c.DeleteOverride(ctx, f.args[0], *scope, *author, *reason)
		return g.report(c, out, err, nil, *asJSON, stdout, stderr)
	})
}

// parseExpiry reads --expires: an RFC 3339 instant, or a duration from now.
func parseExpiry(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("--expires %q is neither an RFC 3339 instant nor a positive duration", s)
	}
	return now.Add(d).UTC().Truncate(time.Second), nil
}

func printOverrides(w io.Writer, recs []policylog.Record, asJSON bool) {
	if asJSON {
		out := make([]policylog.OverrideEntry, 0, len(recs))
		for _, r := range recs {
			out = append(out, policylog.OverrideEntryOf(r))
		}
		_ = json.NewEncoder(w).Encode(out)
		return
	}
	for _, r := range recs {
		o := r.Override
		var what []string
		if o.Tier != "" {
			what = append(what, "tier "+o.Tier)
		}
		if o.Rate > 0 {
			p := o.Period
			if p == "" {
				p = "second"
			}
			what = append(what, fmt.Sprintf("rate %g/%s burst %d", o.Rate, p, o.Burst))
		}
		if o.Quota > 0 {
			what = append(what, fmt.Sprintf("quota %d/%s", o.Quota, o.QuotaPeriod))
		}
		if o.Store != "" {
			what = append(what, "store "+o.Store)
		}
		if !o.Expires.IsZero() {
			what = append(what, "expires "+o.Expires.Format(time.RFC3339))
		}
		scope := r.Scope
		if scope == "" {
			scope = "*"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\trevision %d by %s: %q\n", r.Key, scope, strings.Join(what, ", "), r.Revision, r.Author, o.Reason)
	}
}

// OverrideRecord reads the policy log (KAFKA_BROKERS and the keyring, as
// every verb) to its end within ctx and returns the record of the
// override in force for key and scope (false: none): `limiter key
// inspect` shows its author and reason, which only the log keeps.
func OverrideRecord(ctx context.Context, key, scope string) (policylog.Record, bool, error) {
	keys, err := policyKeys(os.Getenv)
	if err != nil {
		return policylog.Record{}, false, err
	}
	l, err := openPolicyLog(os.Getenv)
	if err != nil {
		return policylog.Record{}, false, err
	}
	defer l.Close()
	if err := l.Exists(ctx); err != nil {
		return policylog.Record{}, false, err
	}
	c := policylog.NewClient(l, true)
	keys.Use(c)
	if err := c.Sync(ctx); err != nil {
		return policylog.Record{}, false, err
	}
	rec, ok := c.State().Override(key, scope)
	return rec, ok, nil
}
