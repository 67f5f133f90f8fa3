// Package kafkaconn is the one place that turns the environment into how
// every binary connects to Kafka: SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512,
// with kafka-go's own sasl/plain and sasl/scram) and TLS (docs/reference.md,
// "Connections to managed services"), and the connection check that makes
// a wrong credential visible: a start-up error line, a readiness reason and
// a counted metric, instead of a silent drop of every event.
//
// The password is read with envconfig (KAFKA_SASL_PASSWORD or
// KAFKA_SASL_PASSWORD_FILE) and lives only inside the SASL mechanism; it is
// re-read on every check (and on Reload, which the limiter calls on
// SIGHUP), so a rotated secret file is used for new connections without a
// restart. Connections already authenticated stay as they are, as Kafka
// allows.
package kafkaconn

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/tlsconf"
)

// The environment variables (docs/reference.md).
const (
	VarMechanism = "KAFKA_SASL_MECHANISM"
	VarUsername  = "KAFKA_SASL_USERNAME"
	VarPassword  = "KAFKA_SASL_PASSWORD" // or KAFKA_SASL_PASSWORD_FILE
)

// GroupSessionTimeout is the default session timeout of every consumer
// group (the meter consumer's, the notifier's, the judge's): how long a
// member that died without leaving holds its partitions before the group
// hands them on. METER_SESSION_TIMEOUT sets it for the meter-consumer.
const GroupSessionTimeout = 10 * time.Second

// GroupConfig is what every consumer group of the repository (the meter
// consumer's, the notifier's, the judge's) sets alike: a heartbeat every
// quarter of the session, a second between join attempts, and 3 s for a
// request to the coordinator, which also bounds leaving the group at
// shutdown. The rebalance timeout is the caller's (how long its members
// take to let go of their partitions), and so is anything else it sets.
func GroupConfig(id string, brokers []string, topic string, dialer *kafka.Dialer, session time.Duration) kafka.ConsumerGroupConfig {
	return kafka.ConsumerGroupConfig{
		ID:                id,
		Brokers:           brokers,
		Dialer:            dialer,
		Topics:            []string{topic},
		SessionTimeout:    session,
		HeartbeatInterval: session / 4,
		JoinGroupBackoff:  time.Second,
		Timeout:           3 * time.Second,
	}
}

// Mechanism names accepted in KAFKA_SASL_MECHANISM.
const (
	Plain       = "plain"
	ScramSHA256 = "scram-sha-256"
	ScramSHA512 = "scram-sha-512"
)

// Security is how to reach the brokers: a TLS configuration (nil = plain
// TCP) and a SASL mechanism (nil = none). Safe for concurrent use.
type Security struct {
	TLS *tls.Config
	// SASL is what Transports and Dialers are given; it always
	// authenticates with the credential read last (Reload).
	SASL sasl.Mechanism

	mech     string // "" when SASL is off
	username string
	getenv   func(string) string
	rot      *rotating
}

// FromEnv reads KAFKA_SASL_* and KAFKA_TLS* through e; problems are
// recorded on e (each naming its variable, never a secret's value).
func FromEnv(e *envconfig.Reader, getenv func(string) string) *Security {
	s := &Security{getenv: getenv}
	s.TLS = tlsconf.ClientFromEnv(e, "KAFKA")
	s.mech = strings.ToLower(e.String(VarMechanism, ""))
	s.username = e.String(VarUsername, "")
	password := e.Secret(VarPassword)
	switch s.mech {
	case "":
		if s.username != "" || password != "" {
			e.Fail(VarMechanism, "required when %s or %s is set (%s, %s or %s)", VarUsername, VarPassword, Plain, ScramSHA256, ScramSHA512)
		}
		return s
	case Plain, ScramSHA256, ScramSHA512:
	default:
		e.Fail(VarMechanism, "%q is not %s, %s or %s", s.mech, Plain, ScramSHA256, ScramSHA512)
		return s
	}
	if s.username == "" {
		e.Fail(VarUsername, "required with %s", VarMechanism)
	}
	if password == "" {
		e.Fail(VarPassword, "required with %s (or %s_FILE)", VarMechanism, VarPassword)
	}
	if s.username == "" || password == "" {
		return s
	}
	inner, err := mechanism(s.mech, s.username, password)
	if err != nil {
		e.Fail(VarPassword, "%v", err)
		return s
	}
	s.rot = &rotating{name: inner.Name()}
	s.rot.cur.Store(&current{m: inner, fingerprint: sha256.Sum256([]byte(password))})
	s.SASL = s.rot
	return s
}

// mechanism builds kafka-go's mechanism. Its errors never hold the password.
func mechanism(name, user, password string) (sasl.Mechanism, error) {
	switch name {
	case Plain:
		return plain.Mechanism{Username: user, Password: password}, nil
	case ScramSHA256, ScramSHA512:
		algo := scram.SHA256
		if name == ScramSHA512 {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, user, password)
		if err != nil {
			// xdg-go/scram's SASLprep errors name the problem, not the
			// input; say only which credential it was.
			return nil, fmt.Errorf("username or password not usable for %s (SASLprep failed)", name)
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown mechanism %q", name)
}

// Describe says, without secrets, how the brokers are reached (for the
// start-up log line).
func (s *Security) Describe() string {
	var parts []string
	if s.TLS != nil {
		parts = append(parts, "tls")
	} else {
		parts = append(parts, "plaintext")
	}
	if s.mech != "" {
		parts = append(parts, fmt.Sprintf("sasl %s as %q", s.mech, s.username))
	}
	return strings.Join(parts, ", ")
}

// String is Describe: %v of a Security never prints the credential.
func (s *Security) String() string { return s.Describe() }

// Warnings are configuration choices to warn about at start.
func (s *Security) Warnings() []string {
	if s.mech == Plain && s.TLS == nil {
		return []string{"KAFKA_SASL_MECHANISM=plain without KAFKA_TLS=true: the password crosses the network unencrypted"}
	}
	return nil
}

// Reload re-reads the password (KAFKA_SASL_PASSWORD or its _FILE) and, when
// it changed, authenticates new connections with it. It reports whether it
// changed; its error names the variable, never the value.
func (s *Security) Reload() (bool, error) {
	if s.rot == nil {
		return false, nil
	}
	password, err := envconfig.ReadSecret(s.getenv, VarPassword)
	if err != nil {
		return false, err
	}
	if password == "" {
		return false, fmt.Errorf("%s is empty", VarPassword)
	}
	if s.rot.cur.Load().fingerprint == sha256.Sum256([]byte(password)) {
		return false, nil
	}
	inner, err := mechanism(s.mech, s.username, password)
	if err != nil {
		return false, fmt.Errorf("%s: %w", VarPassword, err)
	}
	s.rot.cur.Store(&current{m: inner, fingerprint: sha256.Sum256([]byte(password))})
	return true, nil
}

// Transport is a kafka-go Transport that reaches the brokers this way.
func (s *Security) Transport(clientID string, dialTimeout time.Duration) *kafka.Transport {
	return &kafka.Transport{DialTimeout: dialTimeout, ClientID: clientID, TLS: s.TLS, SASL: s.SASL}
}

// Dialer is a kafka-go Dialer (consumer groups, readers) that reaches the
// brokers this way.
func (s *Security) Dialer(clientID string, timeout time.Duration) *kafka.Dialer {
	return &kafka.Dialer{ClientID: clientID, Timeout: timeout, DualStack: true, TLS: s.TLS, SASLMechanism: s.SASL}
}

// rotating is a sasl.Mechanism whose credential can be swapped: every new
// connection authenticates with the one stored last.
type rotating struct {
	name string
	cur  atomic.Pointer[current]
}

type current struct {
	m           sasl.Mechanism
	fingerprint [32]byte // SHA-256 of the password: Reload compares it
}

func (r *rotating) Name() string { return r.name }

func (r *rotating) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	return r.cur.Load().m.Start(ctx)
}

// String keeps the credential out of any %v of a config that holds it.
func (r *rotating) String() string { return "sasl " + r.name }

// GoString is String, for %#v.
func (r *rotating) GoString() string { return r.String() }

var _ sasl.Mechanism = (*rotating)(nil)
var _ fmt.Stringer = (*rotating)(nil)
