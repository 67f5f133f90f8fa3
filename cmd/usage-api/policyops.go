package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
	"github.com/ratewarden/ratewarden/policylog/preview"
)

// policyLogConfig is how usage-api reaches the policy log for the
// operator's policy API: KAFKA_BROKERS (optional: without it those routes
// answer 503), KAFKA_SASL_*, KAFKA_TLS*, POLICY_TOPIC; the operators'
// credentials beside USAGE_ADMIN_TOKEN (USAGE_ADMIN_TOKENS_FILE); the key
// usage-api signs its writes with and the keyring it reads by
// (POLICY_SIGNING_KEY_FILE, POLICY_TRUSTED_KEYS_FILE).
type policyLogConfig struct {
	Brokers    []string
	Topic      string
	Security   *kafkaconn.Security
	TokensFile string
	Keys       policylog.Keys
}

func policyLogConfigFrom(e *envconfig.Reader, getenv func(string) string) policyLogConfig {
	c := policyLogConfig{
		Brokers:    e.List("KAFKA_BROKERS"),
		Topic:      e.String("POLICY_TOPIC", kafkalog.DefaultTopic),
		Security:   kafkaconn.FromEnv(e, getenv),
		TokensFile: e.String("USAGE_ADMIN_TOKENS_FILE", ""),
	}
	keys, err := policylog.LoadKeys(e.String("POLICY_SIGNING_KEY_FILE", ""), e.String("POLICY_TRUSTED_KEYS_FILE", ""))
	if err != nil {
		e.Fail("POLICY_SIGNING_KEY_FILE/POLICY_TRUSTED_KEYS_FILE", "%v", err)
	}
	c.Keys = keys
	for _, a := range c.Brokers {
		e.HostPort("KAFKA_BROKERS", a)
	}
	return c
}

// withPolicyAPI routes the operator's policy API (opsapi) beside next, the
// usage API; the opsapi handler is returned too (the support page reads
// overrides through it). The returned func releases the log's connections.
func withPolicyAPI(cfg config, conn driver.Conn, next http.Handler, log *slog.Logger) (http.Handler, *opsapi.Handler, func(), error) {
	creds, err := opsapi.NewCredentials(cfg.PolicyLog.TokensFile, cfg.AdminToken)
	if err != nil {
		return nil, nil, nil, err
	}
	creds.OnChange = func(err error) { // never a token: errors name lines by number
		if err != nil {
			log.Error("operator credentials refused until the file is fixed (USAGE_ADMIN_TOKEN still works)", "err", err)
			return
		}
		log.Info("operator credentials read again", "file", cfg.PolicyLog.TokensFile)
	}
	oc := opsapi.Config{Credentials: creds, Keys: cfg.PolicyLog.Keys,
		Unavailable: "the policy API needs the policy log: set KAFKA_BROKERS on usage-api",
		Audit: func(ctx context.Context, revision int64, limit int) (any, error) {
			rows, err := chaudit.Query(ctx, conn, cfg.Database, revision, limit)
			if rows == nil {
				rows = []chaudit.Row{}
			}
			return rows, err
		},
		// What a push would newly reject, from the last hour of
		// decisions_raw; bounded well within the API's own deadline.
		Preview: func(ctx context.Context, candidate *policy.WithOverrides) (any, error) {
			ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			res, err := preview.Run(ctx, conn, preview.Config{Database: cfg.Database}, candidate, time.Now())
			if err != nil {
				return nil, err
			}
			return preview.Outcome{Status: preview.Replayed, Result: &res}, nil
		}}
	closeLog := func() {}
	if len(cfg.PolicyLog.Brokers) > 0 {
		l, err := kafkalog.New(kafkalog.Config{Brokers: cfg.PolicyLog.Brokers, Topic: cfg.PolicyLog.Topic,
			Security: cfg.PolicyLog.Security, ClientID: "usage-api-policy"})
		if err != nil {
			return nil, nil, nil, err
		}
		oc.Log, closeLog = l, l.Close
	} else {
		log.Warn("KAFKA_BROKERS is empty: the operator's policy API (/v1/admin/policy, /v1/admin/overrides) answers 503")
	}
	ops, err := opsapi.New(oc)
	if err != nil {
		return nil, nil, nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if opsapi.Owns(r.URL.Path) {
			ops.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	}), ops, closeLog, nil
}
