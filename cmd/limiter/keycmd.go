package main

// `limiter key inspect` and `limiter key reset` (docs/support.md): they
// read the limiter's own variables (LIMITER_FLEET_URLS,
// LIMITER_AUTH_TOKEN, REDIS_*, REDIS_STORES, CLICKHOUSE_*, POLICY_FILE,
// POLICY_SIGNING_KEY_FILE) and run support.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/policyctl"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/support"
)

const keyInspectUsage = `usage:
  limiter key inspect KEY --scope S [--limiters URL,URL...] [--timeout D] [--json]
      everything that decides the key's next answer: the rule, the shared
      bucket and quota, split sub-buckets, each limiter's local view
      (LIMITER_FLEET_URLS), the latest decisions (CLICKHOUSE_ADDR) and the
      audit of its resets; a part that cannot be read is marked, not left out`

const keyResetUsage = `usage:
  limiter key reset KEY --scope S (--refill | --grant N | --clear-debt | --quota) --reason TEXT
      [--author A] [--limiters URL,URL...] [--json]
      signed with POLICY_SIGNING_KEY_FILE and applied by the first limiter of
      LIMITER_FLEET_URLS that answers; refused (exit 1) unless its key is in
      the limiters' POLICY_TRUSTED_KEYS_FILE with role writer or support`

// fleetURLs is --limiters, else LIMITER_FLEET_URLS, split.
func fleetURLs(flagValue string) []string {
	var out []string
	for _, u := range strings.Split(flagValue, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, strings.TrimSuffix(u, "/"))
		}
	}
	return out
}

// keyInspect is `limiter key inspect`.
func keyInspect(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("limiter key inspect")
	scope := fs.String("scope", "", "scope (required: a key's buckets are per scope)")
	urls := fs.String("limiters", os.Getenv("LIMITER_FLEET_URLS"), "comma-separated base URLs of the limiters")
	timeout := fs.Duration("timeout", support.DefaultPartTimeout, "how long each part may take")
	asJSON := fs.Bool("json", false, "print JSON")
	words, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, keyInspectUsage, stdout, stderr)
	}
	if len(words) != 1 || *scope == "" {
		return cli.Refuse("inspect takes one KEY and --scope", fs, keyInspectUsage, stderr)
	}
	e := envconfig.New(os.Getenv)
	rc := redisclient.FromEnv(e, limits.DefaultKeyPrefix)
	named := redisclient.StoresFromEnv(e, rc, limits.ValidStoreName)
	var ch *chconn.Config
	if e.Raw("CLICKHOUSE_ADDR") != "" {
		c := chconn.FromEnv(e, schema.ValidDatabase)
		ch = &c
	}
	policyFile := e.Raw("POLICY_FILE")
	if err := e.Err(); err != nil {
		fmt.Fprintln(stderr, "limiter key inspect: invalid configuration: "+err.Error())
		return cli.ExitUsage
	}
	in := &support.Inspector{Limiters: fleetURLs(*urls), Token: strings.TrimSpace(os.Getenv("LIMITER_AUTH_TOKEN")),
		HTTP: &http.Client{Timeout: 5 * time.Second}, Timeout: *timeout, Stores: map[string]*redisstore.Store{}}
	if rc.Enabled() {
		conn, err := rc.Open(redisclient.Options{Timeout: *timeout, MaxRetries: -1, PoolSize: 4})
		if err == nil {
			defer conn.Close()
			in.Store, in.Prefix = redisstore.New(conn.UniversalClient, rc.KeyPrefix), rc.KeyPrefix
		}
		for _, ns := range named {
			if c, err := ns.Redis.Open(redisclient.Options{Timeout: *timeout, MaxRetries: -1, PoolSize: 2}); err == nil {
				defer c.Close()
				in.Stores[ns.Name] = redisstore.New(c.UniversalClient, ns.Redis.KeyPrefix)
			}
		}
	}
	if ch != nil {
		if conn, err := ch.Open(chconn.Tuning{DialTimeout: *timeout, ReadTimeout: *timeout, MaxOpenConns: 1}); err == nil {
			defer conn.Close()
			in.ClickHouse, in.Database = conn, ch.Database
		}
	}
	if os.Getenv("KAFKA_BROKERS") != "" {
		in.OverrideRecord = policyctl.OverrideRecord // the author and reason of an override in force
	}
	if policyFile != "" {
		in.FallbackRule = func(key, scope string) (*support.Rule, error) {
			p, err := policy.Load(policyFile)
			if err != nil {
				return nil, err
			}
			r, err := support.RuleFor(p, key, scope)
			if r != nil {
				r.From = policyFile
			}
			return r, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*(*timeout)+5*time.Second)
	defer cancel()
	rep := in.Inspect(ctx, words[0], *scope)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		return cli.ExitOK
	}
	printReport(stdout, rep)
	return cli.ExitOK
}

// printReport is inspect's text: one section per part, each saying where
// it was read.
func printReport(w io.Writer, rep support.Report) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	defer tw.Flush()
	unread := func(p support.Part) bool {
		if p.Error != "" {
			fmt.Fprintf(tw, "  UNREAD (%s): %s\n", p.Where, p.Error)
			return true
		}
		return false
	}
	fmt.Fprintf(tw, "key %s, scope %s, at %s\n", rep.Key, rep.Scope, rep.At.Format(time.RFC3339Nano))
	fmt.Fprintln(tw, "rule:")
	if !unread(rep.Rule.Part) && rep.Rule.Rule != nil {
		r := rep.Rule.Rule
		fmt.Fprintf(tw, "  %s (tier %s) rate %g/s burst %d cost %d dry-run %t, from %s\n", r.Policy, r.Tier, r.Limit.Rate, r.Limit.Burst, r.Cost, r.DryRun, r.From)
		if o := r.Override; o != nil {
			fmt.Fprintf(tw, "  override of %s (scope %q), revision %d, by %s: %s\n", o.Key, o.Scope, o.Revision, o.Author, o.Reason)
			if o.RecordError != "" {
				fmt.Fprintf(tw, "    its record: %s\n", o.RecordError)
			}
		}
		for _, l := range strings.Split(strings.TrimSpace(r.Explain), "\n") {
			if l != "" {
				fmt.Fprintln(tw, "    "+l)
			}
		}
	}
	fmt.Fprintln(tw, "bucket:")
	if !unread(rep.Bucket.Part) && rep.Bucket.BucketView != nil {
		b := rep.Bucket.BucketView
		fmt.Fprintf(tw, "  %.3f of %d tokens (rate %g/s), full at %s, ttl %d ms\t%s\n", b.Tokens, b.Capacity, b.Rate, b.FullAt.Format(time.RFC3339Nano), b.TTLms, b.RedisKey)
		if b.Debt > 0 {
			fmt.Fprintf(tw, "  IN DEBT by %.3f tokens\n", b.Debt)
		}
	}
	if q := rep.Quota; q != nil {
		fmt.Fprintln(tw, "quota:")
		if !unread(q.Part) && q.QuotaView != nil {
			fmt.Fprintf(tw, "  %d of %d used, %d left (%s), resets %s\t%s\n", q.Used, q.Limit, q.Left, q.Period, q.ResetAt.Format(time.RFC3339), q.RedisKey)
		}
	}
	fmt.Fprintln(tw, "reservations:")
	if r := rep.Reservations; !unread(r.Part) {
		fmt.Fprintf(tw, "  %d open\t%s\n", r.Total, r.Where)
		for _, o := range r.Open {
			gone := ""
			if o.Gone {
				gone = " (its record is gone)"
			}
			fmt.Fprintf(tw, "  %s: %.3f tokens, expires %s%s\n", o.ID, o.Tokens, o.ExpiresAt.Format(time.RFC3339Nano), gone)
		}
	}
	if s := rep.Split; s != nil {
		fmt.Fprintln(tw, "split:")
		if !unread(s.Part) {
			for _, b := range s.Buckets {
				fmt.Fprintf(tw, "  %.3f of %d\t%s\n", b.Tokens, b.Capacity, b.RedisKey)
			}
		}
	}
	if g := rep.Global; g != nil {
		fmt.Fprintln(tw, "global:")
		if !unread(g.Part) {
			if b := g.Bucket; b != nil {
				fmt.Fprintf(tw, "  global bucket %.3f of %d tokens (rate %g/s), full at %s\t%s\n", b.Tokens, b.Capacity, b.Rate, b.FullAt.Format(time.RFC3339Nano), g.BucketWhere)
			} else {
				fmt.Fprintf(tw, "  global bucket UNREAD (%s): %s\n", g.BucketWhere, g.BucketError)
			}
			for _, p := range g.Pools {
				if p.Error != "" {
					fmt.Fprintf(tw, "  region %s pool UNREAD: %s\t%s\n", p.Region, p.Error, p.From)
					continue
				}
				fmt.Fprintf(tw, "  region %s pool %.3f tokens (debt %.3f, escrow %.3f, owed %.3f), ttl %d ms\t%s via %s\n", p.Region, p.Tokens, p.Debt, p.Escrow, p.Owed, p.TTLms, p.RedisKey, p.From)
			}
		}
	}
	fmt.Fprintln(tw, "limiters:")
	if len(rep.Limiters) == 0 {
		fmt.Fprintln(tw, "  none asked (LIMITER_FLEET_URLS or --limiters)")
	}
	for _, l := range rep.Limiters {
		if l.Error != "" {
			fmt.Fprintf(tw, "  %s\tUNREACHABLE: %s\n", l.URL, l.Error)
			continue
		}
		v := l.View
		state := "holds nothing of the key"
		if v.Held {
			state = fmt.Sprintf("store said %.3f tokens (known %t, trusted %t), local bucket %.3f", v.StoreTokens, v.StoreKnown, v.Trusted, v.LocalTokens)
			if !v.RejectingUntil.IsZero() {
				state += ", rejecting locally until " + v.RejectingUntil.Format(time.RFC3339Nano)
			}
		}
		fmt.Fprintf(tw, "  %s\t%s revision %d\t%s\n", l.URL, l.Instance, l.Policy.Revision, state)
	}
	fmt.Fprintln(tw, "decisions:")
	if !unread(rep.Decisions.Part) {
		for _, d := range rep.Decisions.Rows {
			fmt.Fprintf(tw, "  %s\t%s\tallowed %t\tremaining %d\t%s\t%s\n", d.Time.Format(time.RFC3339Nano), d.Source, d.Allowed, d.Remaining, d.Policy, d.Instance)
		}
	}
	fmt.Fprintln(tw, "soft-limit webhooks:")
	if !unread(rep.Webhooks.Part) {
		for _, w := range rep.Webhooks.Rows {
			fmt.Fprintf(tw, "  %s\t%s\tattempt %d\t%d %s\t%s\n", w.Time.Format(time.RFC3339Nano), w.Scope, w.Attempt, w.StatusCode, w.Outcome, w.URL)
		}
	}
	fmt.Fprintln(tw, "resets (newest first):")
	if rep.ResetsError != "" {
		fmt.Fprintf(tw, "  UNREAD: %s\n", rep.ResetsError)
	}
	for _, r := range rep.Resets {
		var a support.Audit
		_ = json.Unmarshal(r, &a)
		fmt.Fprintf(tw, "  %s\t%s\t%s %s\t%q\n", a.Time.Format(time.RFC3339), a.Author, a.Result, a.Op, a.Reason)
	}
}

// keyReset is `limiter key reset`.
func keyReset(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("limiter key reset")
	scope := fs.String("scope", "", "scope (required)")
	refill := fs.Bool("refill", false, "fill the bucket")
	grant := fs.Int64("grant", 0, "add N tokens, up to the capacity")
	clearDebt := fs.Bool("clear-debt", false, "a bucket below zero back to zero")
	quota := fs.Bool("quota", false, "the quota window's count back to zero")
	reason := fs.String("reason", "", "why (required; in the audit)")
	author := fs.String("author", "", "who the key holder acts for (default: the key's identity)")
	urls := fs.String("limiters", os.Getenv("LIMITER_FLEET_URLS"), "comma-separated base URLs of the limiters")
	asJSON := fs.Bool("json", false, "print JSON")
	words, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, keyResetUsage, stdout, stderr)
	}
	var ops []redisstore.ResetOp
	if *refill {
		ops = append(ops, redisstore.ResetRefill)
	}
	if *grant != 0 {
		ops = append(ops, redisstore.ResetGrant)
	}
	if *clearDebt {
		ops = append(ops, redisstore.ResetClearDebt)
	}
	if *quota {
		ops = append(ops, redisstore.ResetQuota)
	}
	switch {
	case len(words) != 1 || *scope == "":
		return cli.Refuse("reset takes one KEY and --scope", fs, keyResetUsage, stderr)
	case len(ops) != 1:
		return cli.Refuse("reset takes exactly one of --refill, --grant N, --clear-debt, --quota", fs, keyResetUsage, stderr)
	case *grant < 0:
		return cli.Refuse("--grant takes a number of tokens above 0", fs, keyResetUsage, stderr)
	case strings.TrimSpace(*reason) == "":
		return cli.Refuse("refused: a reset must say why (--reason TEXT); it is kept in the key's audit", fs, keyResetUsage, stderr)
	}
	targets := fleetURLs(*urls)
	if len(targets) == 0 {
		return cli.Refuse("no limiter to apply the reset: give --limiters or LIMITER_FLEET_URLS", fs, keyResetUsage, stderr)
	}
	keyFile := os.Getenv("POLICY_SIGNING_KEY_FILE")
	if keyFile == "" {
		fmt.Fprintln(stderr, "limiter key reset: refused: POLICY_SIGNING_KEY_FILE is not set; a reset is signed, and its author is the key's identity")
		return cli.ExitUsage
	}
	signer, err := policylog.LoadSigner(keyFile)
	if err != nil {
		fmt.Fprintln(stderr, "limiter key reset: invalid configuration: POLICY_SIGNING_KEY_FILE: "+err.Error())
		return cli.ExitUsage
	}
	sr, err := support.Sign(signer, support.ResetRequest{ID: support.NewResetID(), Key: words[0], Scope: *scope, Op: ops[0],
		Grant: *grant, Reason: *reason, Author: *author, Time: time.Now().UTC()})
	if err != nil {
		fmt.Fprintln(stderr, "limiter key reset: "+err.Error())
		return cli.ExitFail
	}
	fleet := &support.Inspector{Limiters: targets, Token: strings.TrimSpace(os.Getenv("LIMITER_AUTH_TOKEN"))}
	status, out, u, err := fleet.SendReset(context.Background(), sr) // the next limiter applies it when one is unreachable
	if err != nil {
		fmt.Fprintf(stderr, "limiter key reset: %v\n", err)
		return cli.ExitFail
	}
	return reportReset(status, out, u, *asJSON, stdout, stderr)
}

// reportReset prints a limiter's answer to a reset and returns the exit
// code: 0 applied, 1 refused (the reason named).
func reportReset(status int, out []byte, url string, asJSON bool, stdout, stderr io.Writer) int {
	var ans struct {
		Result string          `json:"result"`
		Record json.RawMessage `json:"record"`
		Error  *struct {
			Code, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &ans); err != nil {
		fmt.Fprintf(stderr, "limiter key reset: %s answered %d: %s\n", url, status, bytes.TrimSpace(out))
		return cli.ExitFail
	}
	if asJSON {
		stdout.Write(out)
	}
	if status == http.StatusOK {
		if !asJSON {
			var a struct {
				support.Audit
				Before, After struct {
					Tokens    float64
					QuotaUsed int64
				}
			}
			_ = json.Unmarshal(ans.Record, &a)
			fmt.Fprintf(stdout, "applied %s on %s/%s by %s: tokens %.3f → %.3f, quota used %d → %d\n",
				a.Op, a.Key, a.Scope, a.Author, a.Before.Tokens, a.After.Tokens, a.Before.QuotaUsed, a.After.QuotaUsed)
		}
		return cli.ExitOK
	}
	if ans.Error == nil {
		fmt.Fprintf(stderr, "limiter key reset: %s answered %d: %s\n", url, status, bytes.TrimSpace(out))
		return cli.ExitFail
	}
	fmt.Fprintf(stderr, "limiter key reset: refused (%s): %s\n", ans.Error.Code, ans.Error.Message)
	return cli.ExitFail
}
