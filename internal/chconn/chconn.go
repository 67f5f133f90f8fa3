// Package chconn is the one place that turns the environment into a
// ClickHouse connection (native protocol, clickhouse-go): CLICKHOUSE_ADDR,
// CLICKHOUSE_DATABASE, CLICKHOUSE_USER, CLICKHOUSE_PASSWORD (or
// CLICKHOUSE_PASSWORD_FILE) and CLICKHOUSE_TLS with CLICKHOUSE_TLS_CA_FILE
// (the secure native port, 9440) — docs/reference.md, "Connections to managed
// services". A refused credential or certificate comes back from Ping as
// an error that says which variable to fix and never holds the password.
//
// clickhouse-go fixes the credential when the pool is opened, so a rotated
// CLICKHOUSE_PASSWORD takes a restart.
package chconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/tlsconf"
)

// Config is where ClickHouse is and how to log in. Its password is
// unexported: printing a Config (%v, %+v) never shows it.
type Config struct {
	Addr     string      // CLICKHOUSE_ADDR, host:port of the native protocol
	Database string      // CLICKHOUSE_DATABASE, the tables' database
	User     string      // CLICKHOUSE_USER, default "default"
	TLS      *tls.Config // CLICKHOUSE_TLS; nil = plain TCP
	password string      // CLICKHOUSE_PASSWORD
}

// FromEnv reads the variables through e; problems are recorded on e.
// validDatabase is the schema's rule for a database name
// (schema.ValidDatabase), passed in: a utility imports no domain package.
func FromEnv(e *envconfig.Reader, validDatabase func(string) bool) Config {
	c := Config{
		Addr:     e.String("CLICKHOUSE_ADDR", "127.0.0.1:9000"),
		Database: e.String("CLICKHOUSE_DATABASE", "ratelimit"),
		User:     e.String("CLICKHOUSE_USER", "default"),
		password: e.Secret("CLICKHOUSE_PASSWORD"),
		TLS:      tlsconf.ClientFromEnv(e, "CLICKHOUSE"),
	}
	e.HostPort("CLICKHOUSE_ADDR", c.Addr)
	if !validDatabase(c.Database) {
		e.Fail("CLICKHOUSE_DATABASE", "%q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", c.Database)
	}
	return c
}

// At is c for another server of the same deployment (a cluster node): the
// same user, password and TLS.
func (c Config) At(addr string) Config {
	c.Addr = addr
	return c
}

// Describe says, without the password, how ClickHouse is reached.
func (c Config) Describe() string {
	s := fmt.Sprintf("%s as %q", c.Addr, c.User)
	if c.TLS != nil {
		return s + ", tls"
	}
	return s + ", plaintext"
}

// String is Describe: %v and %+v of a Config never print the password.
func (c Config) String() string { return c.Describe() }

// GoString is Describe, for %#v.
func (c Config) GoString() string { return c.Describe() }

// Tuning is what differs between the binaries' pools.
type Tuning struct {
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	MaxOpenConns int
}

// Options are clickhouse-go's options for c. The connection's own database
// is "default" (CLICKHOUSE_DATABASE may not exist yet: schema creates it);
// queries name CLICKHOUSE_DATABASE explicitly.
func (c Config) Options(t Tuning) *clickhouse.Options {
	return &clickhouse.Options{
		Addr:         []string{c.Addr},
		Auth:         clickhouse.Auth{Database: "default", Username: c.User, Password: c.password},
		TLS:          c.TLS,
		DialTimeout:  t.DialTimeout,
		ReadTimeout:  t.ReadTimeout,
		MaxOpenConns: t.MaxOpenConns,
		// Every connection the pool may open stays open when idle:
		// clickhouse-go's default keeps 5, so a burst of concurrent
		// INSERTs (the sink writes a table per goroutine) closed the rest
		// and the next burst dialled again, with a fresh handshake and a
		// fresh write buffer to grow.
		MaxIdleConns: t.MaxOpenConns,
	}
}

// Open opens a pool (no connection is made yet) whose Ping explains a
// refused login or certificate.
func (c Config) Open(t Tuning) (driver.Conn, error) {
	conn, err := clickhouse.Open(c.Options(t))
	if err != nil {
		return nil, fmt.Errorf("clickhouse %s: %w", c.Addr, err)
	}
	return &explained{Conn: conn, cfg: c}, nil
}

// explained is a driver.Conn whose Ping names what to fix.
type explained struct {
	driver.Conn
	cfg Config
}

func (x *explained) Ping(ctx context.Context) error {
	return x.cfg.Explain(x.Conn.Ping(ctx))
}

// The server's codes for a refused login: UNKNOWN_USER, WRONG_PASSWORD,
// REQUIRED_PASSWORD (18.16) and AUTHENTICATION_FAILED (current releases).
var authCodes = map[int32]bool{192: true, 193: true, 194: true, 516: true}

// ErrAuth marks a refused login (errors.Is).
var ErrAuth = errors.New("clickhouse refused the login")

// ErrTLS marks a failed TLS handshake (errors.Is).
var ErrTLS = errors.New("clickhouse TLS handshake failed")

type explainedErr struct {
	kind error
	msg  string
	err  error
}

func (e *explainedErr) Error() string   { return e.msg }
func (e *explainedErr) Unwrap() []error { return []error{e.kind, e.err} }

// Explain adds what to fix to a refused login or TLS failure; other errors
// (nil too) are returned as they are. The server's messages name the user,
// never the password.
func (c Config) Explain(err error) error {
	if err == nil {
		return nil
	}
	var (
		exc    *clickhouse.Exception
		verr   *tls.CertificateVerificationError
		unkCA  x509.UnknownAuthorityError
		host   x509.HostnameError
		header tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &exc) && authCodes[exc.Code]:
		return &explainedErr{ErrAuth, fmt.Sprintf("clickhouse %s refused the login as %q: check CLICKHOUSE_USER and CLICKHOUSE_PASSWORD (%v)", c.Addr, c.User, err), err}
	case errors.As(err, &verr), errors.As(err, &unkCA), errors.As(err, &host):
		return &explainedErr{ErrTLS, fmt.Sprintf("clickhouse %s: TLS certificate not trusted: check CLICKHOUSE_TLS_CA_FILE (%v)", c.Addr, err), err}
	case errors.As(err, &header):
		return &explainedErr{ErrTLS, fmt.Sprintf("clickhouse %s did not answer TLS (the plaintext port 9000? the secure native port is 9440): check CLICKHOUSE_ADDR and CLICKHOUSE_TLS (%v)", c.Addr, err), err}
	}
	return err
}
