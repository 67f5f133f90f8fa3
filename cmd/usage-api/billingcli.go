package main

// The billing verbs (docs/billing.md): statement, correct and export,
// each reading ClickHouse (and the decisions log, Stripe) directly with
// the server's variables.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/billing/kafkapub"
	"github.com/ratewarden/ratewarden/metering/billing/stripesend"
	"github.com/ratewarden/ratewarden/schema"
)

// cliEnv is what the billing verbs read from the environment: ClickHouse
// (CLICKHOUSE_*), BILLING_GRACE and POLICY_FILE, as the server does.
type cliEnv struct {
	ch         chconn.Config
	billing    billingConfig
	policyFile string
	brokers    []string            // KAFKA_BROKERS
	kafka      *kafkaconn.Security // KAFKA_SASL_*, KAFKA_TLS*
}

func readCLIEnv() (cliEnv, error) {
	e := envconfig.New(os.Getenv)
	c := cliEnv{ch: chconn.FromEnv(e, schema.ValidDatabase), billing: billingConfigFrom(e), policyFile: e.String("POLICY_FILE", ""),
		brokers: e.List("KAFKA_BROKERS"), kafka: kafkaconn.FromEnv(e, os.Getenv)}
	return c, e.Err()
}

const statementUsage = "usage: usage-api statement (KEY | --account ACCOUNT) --period YYYY-MM [--tz ZONE] [--verify] [--json]"

// runStatement prints a key's statement, read from ClickHouse as the API
// reads it (a final period is frozen by the first statement asked of it,
// here or through the API).
func runStatement(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("usage-api statement")
	period := fs.String("period", "", "the calendar month, YYYY-MM (required)")
	tz := fs.String("tz", "", "the IANA time zone of the month (default UTC)")
	verify := fs.Bool("verify", false, "recompute the period from the raw record and show both")
	asJSON := fs.Bool("json", false, "print the API's JSON instead of a table")
	account := fs.String("account", "", "an account of BILLING_ACCOUNTS_FILE instead of a KEY: each of its keys' statements and their sum")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, statementUsage, stdout, stderr)
	}
	if len(pos) != 1 && *account == "" || len(pos) != 0 && *account != "" || *period == "" {
		return cli.Refuse("KEY or --account (not both) and --period are required", fs, statementUsage, stderr)
	}
	p, err := billing.ParsePeriod(*period, *tz)
	if err != nil {
		return cli.Refuse(err.Error(), fs, statementUsage, stderr)
	}
	env, err := readCLIEnv()
	if err != nil {
		fmt.Fprintf(stderr, "usage-api statement: %v\n", err)
		return cli.ExitUsage
	}
	conn, err := env.ch.Open(chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: 5 * time.Minute, MaxOpenConns: 2})
	if err != nil {
		fmt.Fprintf(stderr, "usage-api statement: %v\n", err)
		return cli.ExitFail
	}
	defer conn.Close()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, _, err := newStatements(conn, env.ch.Database, env.policyFile, env.billing.Grace, log)
	if err != nil {
		fmt.Fprintf(stderr, "usage-api statement: %v\n", err)
		return cli.ExitFail
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if *account != "" {
		return printAccount(ctx, st, env.billing.AccountsFile, *account, p, *verify, *asJSON, stdout, stderr)
	}
	s, err := st.Get(ctx, pos[0], p, *verify)
	if err != nil {
		fmt.Fprintf(stderr, "usage-api statement: %v\n", err)
		return cli.ExitFail
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s)
	} else {
		printStatement(stdout, s)
	}
	if s.Verified != nil && !*s.Verified {
		return cli.ExitFail // the rollups and the raw record disagree: say so in the exit code too
	}
	return cli.ExitOK
}

// printAccount prints an account's statement (each key's, then the sum),
// exiting 1 when verify finds any key's rollups and raw record disagree.
func printAccount(ctx context.Context, st *billing.Statements, file, account string, p billing.Period, verify, asJSON bool, stdout, stderr io.Writer) int {
	accounts, err := readAccounts(file)
	if err == nil && accounts == nil {
		err = errors.New("BILLING_ACCOUNTS_FILE is required with --account")
	}
	if err != nil {
		fmt.Fprintf(stderr, "usage-api statement: %v\n", err)
		return cli.ExitUsage
	}
	a, err := st.Account(ctx, accounts, account, p, verify)
	if err != nil {
		fmt.Fprintf(stderr, "usage-api statement: %v\n", err)
		return cli.ExitFail
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a)
	} else {
		fmt.Fprintf(stdout, "account %s %s (%s, %s to %s): %s, %d keys\n", a.Account, a.Period, a.TZ, a.From, a.To, a.State, len(a.Keys))
		for _, k := range a.Keys {
			fmt.Fprintln(stdout)
			printStatement(stdout, k)
		}
		fmt.Fprintf(stdout, "\naccount total: %d requests, %d cost\n", a.Totals.Requests, a.Totals.Cost)
		if a.Verified != nil {
			fmt.Fprintf(stdout, "account verified: %t (rollups now: %d requests, %d cost; raw record and correction records: %d requests, %d cost)\n",
				*a.Verified, a.Rollups.Requests, a.Rollups.Cost, a.Raw.Requests, a.Raw.Cost)
		}
	}
	if a.Verified != nil && !*a.Verified {
		return cli.ExitFail
	}
	return cli.ExitOK
}

// printStatement writes s as a table for a person.
func printStatement(w io.Writer, s billing.Statement) {
	fmt.Fprintf(w, "statement %s %s (%s, %s to %s): %s", s.Key, s.Period, s.TZ, s.From, s.To, s.State)
	if s.FinalizedAt != "" {
		fmt.Fprintf(w, ", frozen %s", s.FinalizedAt)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "line\tscope\tunit\trequests\tcost\t")
	for _, m := range s.Meters {
		fmt.Fprintf(tw, "meter\t%s\t%s\t%d\t%d\t\n", m.Scope, m.Unit, m.Requests, m.Cost)
	}
	for _, c := range s.Corrections {
		fmt.Fprintf(tw, "correction %s\t%s\t\t%d\t%d\t\n", c.ID, c.Scope, c.Requests, c.Cost)
	}
	for _, a := range s.Adjustments {
		fmt.Fprintf(tw, "adjustment of %s\t\t\t%d\t%d\t\n", a.Period, a.Requests, a.Cost)
	}
	fmt.Fprintf(tw, "total\t\t\t%d\t%d\t\n", s.Totals.Requests, s.Totals.Cost)
	tw.Flush()
	for _, c := range s.Corrections {
		if c.Reason != "" {
			fmt.Fprintf(w, "correction %s (%s by %s): %s\n", c.ID, c.Kind, c.Operator, strings.TrimSpace(c.Reason))
		}
	}
	if s.Verified != nil {
		fmt.Fprintf(w, "verified: %t (rollups now: %d requests, %d cost; raw record and correction records: %d requests, %d cost)\n",
			*s.Verified, s.Rollups.Requests, s.Rollups.Cost, s.Raw.Requests, s.Raw.Cost)
	}
}

const correctUsage = `usage: usage-api correct --id ID --key KEY --reason TEXT
         (--event-id EVENT | --from RFC3339 --to RFC3339 [--scope S] | [--requests N] [--cost N] [--scope S] [--from RFC3339])
         [--json]`

// runCorrect makes a correction as POST /v1/admin/corrections does, with
// ClickHouse (CLICKHOUSE_*) and the decisions log (KAFKA_BROKERS,
// KAFKA_TOPIC, KAFKA_SASL_*, KAFKA_TLS*) reached directly; the operator
// recorded is "cli:" and the login name that ran it.
func runCorrect(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("usage-api correct")
	var req billing.Request
	fs.StringVar(&req.ID, "id", "", "the correction's id: the same id twice counts once (required)")
	fs.StringVar(&req.Key, "key", "", "the key corrected (required)")
	fs.StringVar(&req.Reason, "reason", "", "why, for the audit record (required)")
	fs.StringVar(&req.Scope, "scope", "", "one scope only (a void), or the scope of a credit or debit")
	fs.StringVar(&req.EventID, "event-id", "", "void this one event")
	from := fs.String("from", "", "start of the range voided (RFC 3339, whole minute), or when a credit or debit applies")
	to := fs.String("to", "", "end of the range voided (RFC 3339, exclusive)")
	requests := fs.Int64("requests", 0, "requests added (debit) or removed (credit, negative)")
	cost := fs.Int64("cost", 0, "cost units added (debit) or removed (credit, negative)")
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, correctUsage, stdout, stderr)
	}
	if len(pos) != 0 {
		return cli.Refuse("no positional words: every value is a flag", fs, correctUsage, stderr)
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "requests":
			req.Requests = requests
		case "cost":
			req.Cost = cost
		}
	})
	for _, t := range []struct {
		s   string
		dst **time.Time
	}{{*from, &req.From}, {*to, &req.To}} {
		if t.s == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.s)
		if err != nil {
			return cli.Refuse("--from and --to are RFC 3339 times: "+err.Error(), fs, correctUsage, stderr)
		}
		*t.dst = &v
	}
	env, err := readCLIEnv()
	if err != nil {
		fmt.Fprintf(stderr, "usage-api correct: %v\n", err)
		return cli.ExitUsage
	}
	if len(env.brokers) == 0 {
		fmt.Fprintln(stderr, "usage-api correct: KAFKA_BROKERS is required: a correction is an event on the decisions log")
		return cli.ExitUsage
	}
	conn, err := env.ch.Open(chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: 2 * time.Minute, MaxOpenConns: 2})
	if err != nil {
		fmt.Fprintf(stderr, "usage-api correct: %v\n", err)
		return cli.ExitFail
	}
	defer conn.Close()
	store, err := chstore.New(conn, env.ch.Database)
	if err != nil {
		fmt.Fprintf(stderr, "usage-api correct: %v\n", err)
		return cli.ExitFail
	}
	tr := &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: "usage-api-correct"}
	if env.kafka != nil {
		tr = env.kafka.Transport("usage-api-correct", 5*time.Second)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: env.brokers, Topic: env.billing.Topic, Transport: tr})
	if err != nil {
		fmt.Fprintf(stderr, "usage-api correct: %v\n", err)
		return cli.ExitFail
	}
	defer pub.Close()
	operator := "cli"
	if u, err := user.Current(); err == nil {
		operator = "cli:" + u.Username
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, created, err := (&billing.Corrector{Store: store, Log: pub}).Apply(ctx, req, operator)
	if err != nil {
		fmt.Fprintf(stderr, "usage-api correct: %v\n", err)
		if errors.Is(err, billing.ErrInvalid) {
			return cli.ExitUsage
		}
		return cli.ExitFail
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			billing.Correction
			Net     billing.Totals `json:"net"`
			Created bool           `json:"created"`
		}{c, c.Net(), created})
		return cli.ExitOK
	}
	verb := "recorded"
	if !created {
		verb = "already recorded; its events published again"
	}
	n := c.Net()
	fmt.Fprintf(stdout, "correction %s (%s of %s by %s) %s: %d events, net %+d requests, %+d cost\n",
		c.ID, c.Kind, c.Key, c.Operator, verb, len(c.Pieces), n.Requests, n.Cost)
	return cli.ExitOK
}

const exportUsage = `usage: usage-api export --period YYYY-MM [--tz ZONE] [--keys K1,K2...] (--csv FILE | --json FILE | --stripe [--hourly] [--customers FILE] [--event-requests NAME] [--event-cost NAME])`

// runExport exports a final period's statements: every line to a CSV or
// JSON file (written whole, then renamed into place), or the totals to
// Stripe Billing as meter events (STRIPE_API_KEY; STRIPE_API_BASE for
// another endpoint), resuming where an earlier run stopped. Every row
// exported is recorded in billing_exports with its identifier.
func runExport(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("usage-api export")
	period := fs.String("period", "", "the calendar month, YYYY-MM, final (required)")
	tz := fs.String("tz", "", "the IANA time zone of the month (default UTC)")
	keys := fs.String("keys", "", "comma-separated keys (default: every key with usage in the month)")
	csvPath := fs.String("csv", "", "write every statement line to this CSV file")
	jsonPath := fs.String("json", "", "write every statement line to this JSON file")
	toStripe := fs.Bool("stripe", false, "send each key's totals to Stripe Billing as meter events")
	hourly := fs.Bool("hourly", false, "with --stripe: send the open period's usage since the last run (run it every hour); the final export bills the rest")
	customers := fs.String("customers", "", "with --stripe: a file of lines KEY STRIPE_CUSTOMER_ID (default: the key is the customer id)")
	evReq := fs.String("event-requests", "", "with --stripe: the requests meter's event name (default "+stripesend.DefaultEventRequests+")")
	evCost := fs.String("event-cost", "", "with --stripe: the cost meter's event name (default "+stripesend.DefaultEventCost+")")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, exportUsage, stdout, stderr)
	}
	n := 0
	for _, set := range []bool{*csvPath != "", *jsonPath != "", *toStripe} {
		if set {
			n++
		}
	}
	if len(pos) != 0 || *period == "" || n != 1 {
		return cli.Refuse("--period and exactly one of --csv, --json, --stripe are required", fs, exportUsage, stderr)
	}
	if *hourly && !*toStripe {
		return cli.Refuse("--hourly goes with --stripe: files are of final periods", fs, exportUsage, stderr)
	}
	p, err := billing.ParsePeriod(*period, *tz)
	if err != nil {
		return cli.Refuse(err.Error(), fs, exportUsage, stderr)
	}
	var keyList []string
	if *keys != "" {
		keyList = strings.Split(*keys, ",")
	}
	e := envconfig.New(os.Getenv)
	stripeKey, stripeBase := e.Secret("STRIPE_API_KEY"), e.String("STRIPE_API_BASE", "")
	env, err := readCLIEnv()
	if err == nil {
		err = e.Err()
	}
	if err == nil && *toStripe && stripeKey == "" {
		err = errors.New("STRIPE_API_KEY: required with --stripe")
	}
	if err != nil {
		fmt.Fprintf(stderr, "usage-api export: %v\n", err)
		return cli.ExitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "usage-api export: %v\n", err)
		return cli.ExitFail
	}
	conn, err := env.ch.Open(chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: 5 * time.Minute, MaxOpenConns: 2})
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, store, err := newStatements(conn, env.ch.Database, env.policyFile, env.billing.Grace, log)
	if err != nil {
		return fail(err)
	}
	x := &billing.Exporter{Statements: st, Store: store}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, time.Hour)
	defer cancelT()

	if *toStripe {
		cfg := stripesend.Config{APIKey: stripeKey, URL: stripeBase, EventRequests: *evReq, EventCost: *evCost}
		if *customers != "" {
			m, err := readCustomers(*customers)
			if err != nil {
				return fail(err)
			}
			cfg.Customer = func(k string) string {
				if c, ok := m[k]; ok {
					return c
				}
				return k
			}
		}
		snd, err := stripesend.New(cfg)
		if err != nil {
			return fail(err)
		}
		if *hourly {
			sent, err := x.SendOpen(ctx, p, keyList, "stripe", snd)
			fmt.Fprintf(stdout, "sent %d hourly meter events of %s (%s, open) to Stripe\n", sent, p, p.TZ())
			if err != nil {
				return fail(fmt.Errorf("%w (run again to resume: rows already recorded are skipped)", err))
			}
			return cli.ExitOK
		}
		sent, refused, err := x.Send(ctx, p, keyList, "stripe", snd)
		fmt.Fprintf(stdout, "sent %d meter events of %s (%s) to Stripe\n", sent, p, p.TZ())
		for _, r := range refused {
			fmt.Fprintf(stdout, "not sent (negative %s %d): %s of %s\n", r.Measure, r.Value(), r.Identifier, r.Key)
		}
		if err != nil {
			return fail(fmt.Errorf("%w (run again to resume: rows already recorded are skipped)", err))
		}
		return cli.ExitOK
	}
	format, path := billing.FormatCSV, *csvPath
	if *jsonPath != "" {
		format, path = billing.FormatJSON, *jsonPath
	}
	rows, err := x.Rows(ctx, p, keyList, false)
	if err != nil {
		return fail(err)
	}
	if err := writeFileAtomically(path, func(w io.Writer) error { return billing.WriteRows(w, format, rows) }); err != nil {
		return fail(err)
	}
	abs, _ := filepath.Abs(path)
	if len(rows) > 0 {
		if err := store.RecordExport(ctx, format+":"+abs, rows, time.Now()); err != nil {
			return fail(fmt.Errorf("the file is written but its record is not (run again): %w", err))
		}
	}
	fmt.Fprintf(stdout, "wrote %d rows of %s (%s) to %s\n", len(rows), p, p.TZ(), path)
	return cli.ExitOK
}

// writeFileAtomically writes path through a temporary file in the same
// directory, synced and renamed into place: a run killed midway leaves
// the old file or none, never half of one.
func writeFileAtomically(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// readCustomers reads lines KEY STRIPE_CUSTOMER_ID (blank lines and lines
// starting with '#' skipped).
func readCustomers(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: want KEY STRIPE_CUSTOMER_ID", path, i+1)
		}
		m[f[0]] = f[1]
	}
	return m, nil
}
