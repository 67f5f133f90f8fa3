package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/billingapi"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/billing/kafkapub"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
)

// billingConfig is billing's part of the environment (docs/billing.md).
type billingConfig struct {
	Grace time.Duration // BILLING_GRACE: how long after its end a period takes late events
	Topic string        // KAFKA_TOPIC: the decisions topic, where corrections are published
	// AccountsFile (BILLING_ACCOUNTS_FILE) maps keys to accounts, lines
	// "KEY ACCOUNT"; "" = no account statements.
	AccountsFile string
}

func billingConfigFrom(e *envconfig.Reader) billingConfig {
	return billingConfig{Grace: e.Duration("BILLING_GRACE", billing.DefaultGrace, time.Minute, 90*24*time.Hour),
		Topic: e.String("KAFKA_TOPIC", metering.DefaultTopic), AccountsFile: e.String("BILLING_ACCOUNTS_FILE", "")}
}

// readAccounts reads BILLING_ACCOUNTS_FILE, none when it is not set.
func readAccounts(path string) (billing.Accounts, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("BILLING_ACCOUNTS_FILE: %w", err)
	}
	defer f.Close()
	a, err := billing.ParseAccounts(f)
	if err != nil {
		return nil, fmt.Errorf("BILLING_ACCOUNTS_FILE %s: %w", path, err)
	}
	return a, nil
}

// statementFunc is the usage API's GET /v1/statement (the dashboard's),
// answered by st.
func statementFunc(st *billing.Statements) usage.StatementFunc {
	return func(ctx context.Context, key, period, tz string) (any, error) {
		p, err := billing.ParsePeriod(period, tz)
		if err != nil {
			return nil, err
		}
		return st.Get(ctx, key, p, false)
	}
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
func withBilling(cfg config, st *billing.Statements, store *chstore.Store, next http.Handler, log *slog.Logger) (http.Handler, func(), error) {
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
	accounts, err := readAccounts(cfg.Billing.AccountsFile)
	if err != nil {
		closePub()
		return nil, nil, err
	}
	h, err := billingapi.New(billingapi.Config{Statements: st, Corrections: corrector, Accounts: accounts, Logger: log, Timeout: cfg.QueryTimeout,
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
