package kafkaconn

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testcerts"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// secureBroker starts a kfake broker with TLS and one user per mechanism.
func secureBroker(t *testing.T, certs *testcerts.Set, password string) *kafkadev.Broker {
	t.Helper()
	testenv.SkipShort(t) // starts a broker
	var users []kafkadev.User
	for _, m := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		users = append(users, kafkadev.User{Mechanism: m, Name: "svc-" + strings.ToLower(m), Password: password})
	}
	b, err := kafkadev.Start(kafkadev.Config{Topic: "t", Partitions: 1, Users: users, TLS: certs.ServerTLS(false)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func newChecker(t *testing.T, env map[string]string, broker string, timeout time.Duration) (*Checker, *prometheus.Registry) {
	t.Helper()
	e := envconfig.New(envOf(env))
	sec := FromEnv(e, envOf(env))
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := NewChecker(CheckerConfig{Brokers: []string{broker}, Security: sec, Timeout: timeout,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// TestCheckAgainstSecureBroker: each mechanism over TLS is accepted with the
// right password; a wrong password, an untrusted CA and TLS against a
// plaintext listener each give their own result and a reason that names
// the variable to fix and never the password; each is counted.
func TestCheckAgainstSecureBroker(t *testing.T) {
	testenv.SkipShort(t) // starts a broker
	certs, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const good, bad = "pw-Good-7f3a9c", "pw-WRONG-41d2e8"
	b := secureBroker(t, certs, good)
	otherCA, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	plainBroker, err := kafkadev.Start(kafkadev.Config{Topic: "t", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plainBroker.Close)

	for _, mech := range []string{Plain, ScramSHA256, ScramSHA512} {
		base := map[string]string{VarMechanism: mech, VarUsername: "svc-" + mech, "KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": certs.CAFile}
		with := func(kv ...string) map[string]string {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			for i := 0; i < len(kv); i += 2 {
				m[kv[i]] = kv[i+1]
			}
			return m
		}
		cases := []struct {
			name, broker, result, mention string
			env                           map[string]string
			timeout                       time.Duration
		}{
			{"ok", b.Addr(), ResultOK, "", with(VarPassword, good), 30 * time.Second},
			{"wrong password", b.Addr(), ResultAuth, VarPassword, with(VarPassword, bad), 30 * time.Second},
			{"untrusted CA", b.Addr(), ResultTLS, "KAFKA_TLS_CA_FILE", with(VarPassword, good, "KAFKA_TLS_CA_FILE", otherCA.CAFile), 30 * time.Second},
			// The plaintext broker never answers a ClientHello: the check
			// runs into its deadline whatever the machine's speed.
			{"TLS to a plaintext listener", plainBroker.Addr(), ResultUnreachable, "KAFKA_TLS", with(VarPassword, good), 2 * time.Second},
		}
		for _, c := range cases {
			t.Run(mech+"/"+c.name, func(t *testing.T) {
				ck, _ := newChecker(t, c.env, c.broker, c.timeout)
				reason := ck.Check(context.Background())
				ok, why := ck.Ready()
				if (c.result == ResultOK) != ok || why != reason {
					t.Fatalf("Ready() = %v %q after Check() = %q", ok, why, reason)
				}
				if c.result == ResultOK {
					if reason != "" {
						t.Fatalf("check failed: %s", reason)
					}
				} else if !strings.Contains(reason, c.mention) {
					t.Fatalf("reason %q does not mention %s", reason, c.mention)
				}
				if got := testutil.ToFloat64(ck.checks.WithLabelValues(c.result)); got != 1 {
					t.Fatalf("kafka_connection_checks_total{result=%q} = %v, want 1 (reason %q)", c.result, got, reason)
				}
				if strings.Contains(reason, good) || strings.Contains(reason, bad) {
					t.Fatalf("reason holds the password: %q", reason)
				}
			})
		}
	}
}

// TestRotatedPasswordFileIsPickedUp: the checker re-reads
// KAFKA_SASL_PASSWORD_FILE before each check, so fixing the file fixes the
// connection without a restart.
func TestRotatedPasswordFileIsPickedUp(t *testing.T) {
	certs, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const good = "rotated-Good-55e1"
	b := secureBroker(t, certs, good)
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte("stale-password-0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{VarMechanism: ScramSHA512, VarUsername: "svc-scram-sha-512", VarPassword + "_FILE": file,
		"KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": certs.CAFile}
	ck, _ := newChecker(t, env, b.Addr(), 30*time.Second)
	if reason := ck.Check(context.Background()); !strings.Contains(reason, "refused SASL") {
		t.Fatalf("with the stale password: %q, want a refused credential", reason)
	}
	if err := os.WriteFile(file, []byte(good+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if reason := ck.Check(context.Background()); reason != "" {
		t.Fatalf("after fixing the file: %q", reason)
	}
}

func TestFromEnvProblems(t *testing.T) {
	cases := []struct {
		env     map[string]string
		mention string
	}{
		{map[string]string{VarMechanism: "gssapi", VarUsername: "u", VarPassword: "p"}, VarMechanism},
		{map[string]string{VarUsername: "u"}, VarMechanism},
		{map[string]string{VarMechanism: Plain, VarPassword: "p"}, VarUsername},
		{map[string]string{VarMechanism: Plain, VarUsername: "u"}, VarPassword},
		{map[string]string{VarMechanism: Plain, VarUsername: "u", VarPassword: "p", VarPassword + "_FILE": "/x"}, VarPassword},
		{map[string]string{"KAFKA_TLS_CA_FILE": "/ca.pem"}, "KAFKA_TLS"},
		{map[string]string{"KAFKA_TLS": "yes please"}, "KAFKA_TLS"},
		{map[string]string{"KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": "/does/not/exist"}, "KAFKA_TLS_CA_FILE"},
		{map[string]string{"KAFKA_TLS": "true", "KAFKA_TLS_CERT_FILE": "/c.pem"}, "KAFKA_TLS_KEY_FILE"}, // the missing one
	}
	for _, c := range cases {
		e := envconfig.New(envOf(c.env))
		FromEnv(e, envOf(c.env))
		err := e.Err()
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.mention)
		}
		if err != nil && c.env[VarPassword] != "" && strings.Contains(err.Error(), "="+c.env[VarPassword]) {
			t.Errorf("%v: error holds the password: %v", c.env, err)
		}
	}
	e := envconfig.New(envOf(nil))
	if s := FromEnv(e, envOf(nil)); e.Err() != nil || s.TLS != nil || s.SASL != nil || s.Describe() != "plaintext" {
		t.Fatalf("empty environment: %v %+v", e.Err(), s)
	}
}
