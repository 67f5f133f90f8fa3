package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/promdecl"
)

// Result kinds of a connection check, the values of the "result" label.
const (
	ResultOK          = "ok"
	ResultAuth        = "auth"        // the broker refused the SASL credential or mechanism
	ResultTLS         = "tls"         // the TLS handshake failed (CA, certificate, a plaintext port)
	ResultUnreachable = "unreachable" // no broker answered
)

// DefaultCheckEvery is the time between connection checks
// (LIMITER_KAFKA_CHECK_EVERY, METER_KAFKA_CHECK_EVERY).
const DefaultCheckEvery = 10 * time.Second

// CheckerConfig configures a Checker. Zero durations take the defaults.
type CheckerConfig struct {
	Brokers  []string      // required
	Security *Security     // required
	ClientID string        // default "ratewarden"
	Every    time.Duration // between checks, default DefaultCheckEvery
	Timeout  time.Duration // one check (dial, TLS, SASL, Metadata), default 10 s

	Logger   *slog.Logger          // required
	Registry prometheus.Registerer // required
}

// Checker checks, on a fresh connection each time, that a broker accepts
// this process's TLS and SASL settings and answers a Metadata request. The
// clients of kafka-go retry what fails inside them and tell it to no one
// (a consumer group that cannot authenticate just never joins; a writer
// drops its batches): the checker turns that into a readiness reason, a
// log line on each change and a counter. Before each check it re-reads the
// password (Security.Reload), so a rotated secret file is picked up.
type Checker struct {
	cfg   CheckerConfig
	log   *slog.Logger
	state atomic.Pointer[checkState]
	nudge chan struct{} // Recheck: check now

	checks *prometheus.CounterVec
	up     prometheus.Gauge
}

type checkState struct {
	result string
	reason string
}

// NewChecker validates cfg and registers the metrics
// (kafka_connection_checks_total{result}, kafka_connection_up).
func NewChecker(cfg CheckerConfig) (*Checker, error) {
	if len(cfg.Brokers) == 0 || cfg.Security == nil || cfg.Logger == nil || cfg.Registry == nil {
		return nil, errors.New("kafkaconn: Brokers, Security, Logger and Registry are required")
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "ratewarden"
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultCheckEvery
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	c := &Checker{
		cfg: cfg, log: cfg.Logger, nudge: make(chan struct{}, 1),
		checks: promdecl.CounterVec("kafka_connection_checks_total", "Checks that a broker accepts this process's TLS and SASL settings, by result (ok, auth, tls, unreachable).", "result"),
		up:     promdecl.Gauge("kafka_connection_up", "1 when the last connection check to Kafka succeeded, else 0."),
	}
	for _, r := range []string{ResultOK, ResultAuth, ResultTLS, ResultUnreachable} {
		c.checks.WithLabelValues(r)
	}
	for _, col := range []prometheus.Collector{c.checks, c.up} {
		if err := cfg.Registry.Register(col); err != nil {
			return nil, fmt.Errorf("kafkaconn: metrics: %w", err)
		}
	}
	c.state.Store(&checkState{result: ResultUnreachable, reason: "kafka: not checked yet"})
	return c, nil
}

// Ready is false, with a reason that names no secret, while the last check
// failed.
func (c *Checker) Ready() (bool, string) {
	s := c.state.Load()
	return s.result == ResultOK, s.reason
}

// Refused is true while the last check found that the broker refuses this
// process's connections (the SASL credential or mechanism, the TLS
// handshake), as opposed to no broker answering.
func (c *Checker) Refused() bool {
	r := c.state.Load().result
	return r == ResultAuth || r == ResultTLS
}

// Check re-reads the password, checks once and records the result; it
// logs when the result changes (at Error for a refused credential or TLS,
// which only the operator can fix). It returns the reason, "" when ok.
func (c *Checker) Check(ctx context.Context) string {
	if changed, err := c.cfg.Security.Reload(); err != nil {
		c.log.Error("kafka: cannot re-read the SASL password; keeping the previous one", "err", err)
	} else if changed {
		c.log.Info("kafka: SASL password changed; new connections use it")
	}
	result, reason := c.check(ctx)
	c.checks.WithLabelValues(result).Inc()
	prev := c.state.Swap(&checkState{result: result, reason: reason})
	switch {
	case result == ResultOK:
		c.up.Set(1)
		if prev.result != ResultOK {
			c.log.Info("kafka: connected", "brokers", c.cfg.Brokers, "security", c.cfg.Security.Describe())
		}
	case prev.result != result || prev.reason != reason:
		c.up.Set(0)
		lvl := slog.LevelError
		if result == ResultUnreachable {
			lvl = slog.LevelWarn
		}
		c.log.Log(ctx, lvl, "kafka: connection check failed", "result", result, "reason", reason,
			"brokers", c.cfg.Brokers, "security", c.cfg.Security.Describe())
	default:
		c.up.Set(0)
	}
	if result == ResultOK {
		return ""
	}
	return reason
}

// Run checks at once (so a refused credential is logged at start-up), then
// every Every, until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	c.Check(ctx)
	lifecycle.EveryOrWake(ctx, c.cfg.Every, c.nudge, func(ctx context.Context) { c.Check(ctx) })
}

// Recheck makes Run re-read the password and check now (SIGHUP). It never
// blocks.
func (c *Checker) Recheck() {
	select {
	case c.nudge <- struct{}{}:
	default:
	}
}

// check dials each broker in turn until one answers a Metadata request.
// When none does, a refused credential or a TLS failure outranks an
// unreachable broker in what is reported.
func (c *Checker) check(ctx context.Context) (string, string) {
	d := c.cfg.Security.Dialer(c.cfg.ClientID, c.cfg.Timeout)
	result, reason := ResultUnreachable, ""
	for _, b := range c.cfg.Brokers {
		err := c.checkOne(ctx, d, b)
		if err == nil {
			return ResultOK, ""
		}
		r, why := c.classify(b, err)
		if reason == "" || rank(r) > rank(result) {
			result, reason = r, why
		}
		if ctx.Err() != nil {
			break
		}
	}
	return result, reason
}

func rank(result string) int {
	switch result {
	case ResultAuth:
		return 2
	case ResultTLS:
		return 1
	}
	return 0
}

func (c *Checker) checkOne(ctx context.Context, d *kafka.Dialer, broker string) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", broker)
	if err != nil {
		return err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	if err := conn.SetDeadline(dl); err != nil {
		return err
	}
	_, err = conn.Brokers() // a Metadata request (no topics: nothing is auto-created)
	return err
}

// classify turns a check's error into a result and a reason an operator
// can act on. kafka-go's errors name the broker and the protocol error,
// never the credential.
func (c *Checker) classify(broker string, err error) (string, string) {
	sec := c.cfg.Security
	var (
		verr   *tls.CertificateVerificationError
		unkCA  x509.UnknownAuthorityError
		host   x509.HostnameError
		header tls.RecordHeaderError
		alert  tls.AlertError
	)
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed), errors.Is(err, kafka.IllegalSASLState):
		return ResultAuth, fmt.Sprintf("kafka: broker %s refused SASL %s authentication as %q: check %s and %s (%v)",
			broker, sec.mech, sec.username, VarUsername, VarPassword, err)
	case errors.Is(err, kafka.UnsupportedSASLMechanism):
		return ResultAuth, fmt.Sprintf("kafka: broker %s does not accept SASL mechanism %s: check %s (%v)", broker, sec.mech, VarMechanism, err)
	case errors.As(err, &verr), errors.As(err, &unkCA), errors.As(err, &host):
		return ResultTLS, fmt.Sprintf("kafka: broker %s: TLS certificate not trusted: check KAFKA_TLS_CA_FILE (%v)", broker, err)
	case errors.As(err, &header):
		return ResultTLS, fmt.Sprintf("kafka: broker %s did not answer TLS (a plaintext listener?): check KAFKA_TLS and the port (%v)", broker, err)
	case errors.As(err, &alert):
		return ResultTLS, fmt.Sprintf("kafka: broker %s refused the TLS handshake (a client certificate required?): check KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE (%v)", broker, err)
	}
	if sec.TLS != nil && errors.Is(err, context.DeadlineExceeded) {
		// A TLS ClientHello sent to a plaintext listener is read as the
		// start of a huge request: the broker waits for the rest.
		return ResultUnreachable, fmt.Sprintf("kafka: broker %s: no answer within %s (a plaintext listener? then KAFKA_TLS must not be true): %v", broker, c.cfg.Timeout, err)
	}
	return ResultUnreachable, fmt.Sprintf("kafka: broker %s: %v", broker, err)
}
