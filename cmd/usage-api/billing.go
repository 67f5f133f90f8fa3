package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/billingapi"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/billing/kafkapub"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
)

// billingConfig is billing's part of the environment (docs/billing.md).
type billingConfig struct {
	Grace time.Duration // BILLING_GRACE: how long after its end a period takes late events
	Topic string        // KAFKA_TOPIC: the decisions topic, where corrections are published
}

func billingConfigFrom(e *envconfig.Reader) billingConfig {
	return billingConfig{Grace: e.Duration("BILLING_GRACE", billing.DefaultGrace, time.Minute, 90*24*time.Hour),
		Topic: e.String("KAFKA_TOPIC", metering.DefaultTopic)}
}

// newStatements builds the statements of database over conn, with the
// cost units of the policy file (none without one).
func newStatements(conn driver.Conn, database, policyFile string, grace time.Duration, log *slog.Logger) (*billing.Statements, *chstore.Store, error) {
	store, err := chstore.New(conn, database)
	if err != nil {
		return nil, nil, err
	}
	st := &billing.Statements{Store: store, Grace: grace}
	if policyFile != "" {
		cur := policy.NewCurrent(policyFile, func(err error) {
			log.Warn("policy file refused; keeping the previous one", "path", policyFile, "err", err)
		})
		st.Units = func(key, scope string) string {
			pol, err := cur.Get()
			if err != nil {
				return "" // the figures do not depend on the policy
			}
			res, err := pol.Resolve(key, scope, "")
			if err != nil {
				return ""
			}
			return res.Unit
		}
	}
	return st, store, nil
}

// withBilling routes billing's operator routes (billingapi) beside next.
// Any operator credential reads statements; one whose role may write
// overrides or the policy makes corrections, under its identity. The
// returned func releases the Kafka writer of corrections.
func withBilling(cfg config, conn driver.Conn, next http.Handler, log *slog.Logger) (http.Handler, func(), error) {
	st, store, err := newStatements(conn, cfg.Database, cfg.PolicyFile, cfg.Billing.Grace, log)
	if err != nil {
		return nil, nil, err
	}
	var corrector *billing.Corrector
	closePub := func() {}
	if len(cfg.PolicyLog.Brokers) > 0 {
		tr := &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: "usage-api-billing"}
		if cfg.PolicyLog.Security != nil {
			tr = cfg.PolicyLog.Security.Transport("usage-api-billing", 5*time.Second)
		}
		pub, err := kafkapub.New(kafkapub.Config{Brokers: cfg.PolicyLog.Brokers, Topic: cfg.Billing.Topic, Transport: tr})
		if err != nil {
			return nil, nil, err
		}
		corrector = &billing.Corrector{Store: store, Log: pub}
		closePub = func() { _ = pub.Close() }
	}
	creds, err := opsapi.NewCredentials(cfg.PolicyLog.TokensFile, cfg.AdminToken)
	if err != nil {
		closePub()
		return nil, nil, err
	}
	h, err := billingapi.New(billingapi.Config{Statements: st, Corrections: corrector, Logger: log, Timeout: cfg.QueryTimeout,
		Authenticate: func(r *http.Request) (billingapi.Operator, bool) {
			tok, ok := bearer.Token(r.Header.Get("Authorization"))
			if !ok {
				return billingapi.Operator{}, false
			}
			p, ok, _ := creds.Lookup(tok) // a broken file leaves USAGE_ADMIN_TOKEN working
			if !ok {
				return billingapi.Operator{}, false
			}
			return billingapi.Operator{Identity: p.Identity, CanWrite: p.Role == opsapi.RolePolicy || p.Role == opsapi.RoleOverrides}, true
		}})
	if err != nil {
		closePub()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	for _, prefix := range billingapi.Routes() {
		mux.Handle(prefix, h)
	}
	mux.Handle("/", next)
	return mux, closePub, nil
}

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
	c := cliEnv{ch: chconn.FromEnv(e), billing: billingConfigFrom(e), policyFile: e.String("POLICY_FILE", ""),
		brokers: e.List("KAFKA_BROKERS"), kafka: kafkaconn.FromEnv(e, os.Getenv)}
	return c, e.Err()
}

const statementUsage = "usage: usage-api statement KEY --period YYYY-MM [--tz ZONE] [--verify] [--json]"

// runStatement prints a key's statement, read from ClickHouse as the API
// reads it (a final period is frozen by the first statement asked of it,
// here or through the API).
func runStatement(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("usage-api statement")
	period := fs.String("period", "", "the calendar month, YYYY-MM (required)")
	tz := fs.String("tz", "", "the IANA time zone of the month (default UTC)")
	verify := fs.Bool("verify", false, "recompute the period from the raw record and show both")
	asJSON := fs.Bool("json", false, "print the API's JSON instead of a table")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, statementUsage, stdout, stderr)
	}
	if len(pos) != 1 || *period == "" {
		return cli.Refuse("KEY and --period are required", fs, statementUsage, stderr)
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
