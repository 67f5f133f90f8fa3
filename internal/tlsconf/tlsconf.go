// Package tlsconf turns certificate files named by the environment into
// crypto/tls configurations: the client side of a connection to a managed
// service (a CA bundle, an optional client certificate, a server name, a
// minimum version) and the server side of a binary's own listener (a
// certificate and key that can be re-read without a restart).
//
// Errors name the file's path and what is wrong with it, never its content:
// a private key is a secret.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/ratewarden/ratewarden/internal/envconfig"
)

// MinVersion parses a minimum TLS version: "1.2" or "1.3" ("" = 1.2, the
// default; older versions are refused on purpose).
func MinVersion(s string) (uint16, error) {
	switch strings.TrimSpace(s) {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("%q is not a TLS version this supports (1.2 or 1.3)", s)
}

// Files names the files of the client side of a TLS connection.
type Files struct {
	CAFile     string // PEM bundle of the CAs to trust; "" = the system's roots
	CertFile   string // PEM client certificate (mutual TLS); "" = none
	KeyFile    string // its PEM private key; required with CertFile
	ServerName string // name to verify the server's certificate against; "" = the host dialed
	MinVersion uint16 // tls.VersionTLS12 when 0
}

// Problem is what is wrong with one file, with the variable that names it
// chosen by the caller (Var is "CA", "cert" or "key").
type Problem struct {
	Var string
	Err error
}

func (p *Problem) Error() string { return p.Var + ": " + p.Err.Error() }
func (p *Problem) Unwrap() error { return p.Err }

// Client builds a client tls.Config from f, reading every file now. Each
// problem is a *Problem (joined with errors.Join) so the caller can name
// its variable.
func Client(f Files) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: f.ServerName, MinVersion: f.MinVersion}
	if cfg.MinVersion == 0 {
		cfg.MinVersion = tls.VersionTLS12
	}
	var errs []error
	if f.CAFile != "" {
		pool, err := CAPool(f.CAFile)
		if err != nil {
			errs = append(errs, &Problem{"CA", err})
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		errs = append(errs, &Problem{"key", errors.New("a client certificate needs its key file as well")})
	case f.CertFile == "" && f.KeyFile != "":
		errs = append(errs, &Problem{"cert", errors.New("a client key needs its certificate file as well")})
	case f.CertFile != "":
		cert, err := loadPair(f.CertFile, f.KeyFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			cfg.Certificates = []tls.Certificate{cert}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// CAPool reads a PEM bundle of CA certificates.
func CAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// loadPair reads a certificate and its key; a problem is a *Problem naming
// which of the two is at fault where that can be told.
func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	if _, err := os.Stat(certFile); err != nil {
		return tls.Certificate{}, &Problem{"cert", err}
	}
	if _, err := os.Stat(keyFile); err != nil {
		return tls.Certificate{}, &Problem{"key", err}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		// crypto/tls's messages name the PEM block types, never key material.
		return tls.Certificate{}, &Problem{"cert", fmt.Errorf("%s with key %s: %w", certFile, keyFile, err)}
	}
	return cert, nil
}

// ServerCert is a listener's certificate and key, re-read by Reload (on
// SIGHUP) so that a renewed certificate is served without a restart. New
// connections get the latest certificate that loaded; a failed Reload
// keeps the previous one. Safe for concurrent use.
type ServerCert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// NewServerCert loads the pair once; an error is a *Problem.
func NewServerCert(certFile, keyFile string) (*ServerCert, error) {
	s := &ServerCert{certFile: certFile, keyFile: keyFile}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload re-reads the files; on error the previous certificate stays.
func (s *ServerCert) Reload() error {
	cert, err := loadPair(s.certFile, s.keyFile)
	if err != nil {
		return err
	}
	s.cur.Store(&cert)
	return nil
}

// Config is a server tls.Config serving the current certificate, TLS 1.2
// or later (http.Server.ServeTLS and gRPC's credentials add the ALPN
// protocols they speak).
func (s *ServerCert) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cur.Load(), nil
		},
	}
}

// ServerFromEnv reads a listener's certificate variables (certVar and
// keyVar, e.g. LIMITER_TLS_CERT_FILE and LIMITER_TLS_KEY_FILE): both set =
// the pair, loaded now (a problem is recorded on e under the variable at
// fault); neither = nil, plain text; one alone is a problem.
func ServerFromEnv(e *envconfig.Reader, certVar, keyVar string) *ServerCert {
	cert, key := e.String(certVar, ""), e.String(keyVar, "")
	switch {
	case cert == "" && key == "":
		return nil
	case key == "":
		e.Fail(keyVar, "required with %s", certVar)
		return nil
	case cert == "":
		e.Fail(certVar, "required with %s", keyVar)
		return nil
	}
	s, err := NewServerCert(cert, key)
	if err != nil {
		name := certVar
		var p *Problem
		if errors.As(err, &p) && p.Var == "key" {
			name = keyVar
		}
		if p != nil {
			err = p.Err
		}
		e.Fail(name, "%v", err)
		return nil
	}
	return s
}

// FilesFromEnv reads the client TLS variables of one backend: prefix+"_TLS"
// (true enables TLS), prefix+"_TLS_CA_FILE", "_TLS_CERT_FILE",
// "_TLS_KEY_FILE", "_TLS_SERVER_NAME" and "_TLS_MIN_VERSION" (1.2 or 1.3).
// A file or name given while TLS is off is a problem: the operator meant
// TLS and would otherwise connect in plain text. Problems are recorded on e,
// each naming its variable.
func FilesFromEnv(e *envconfig.Reader, prefix string) (on bool, f Files) {
	on = e.Bool(prefix+"_TLS", false)
	f = Files{
		CAFile:     e.String(prefix+"_TLS_CA_FILE", ""),
		CertFile:   e.String(prefix+"_TLS_CERT_FILE", ""),
		KeyFile:    e.String(prefix+"_TLS_KEY_FILE", ""),
		ServerName: e.String(prefix+"_TLS_SERVER_NAME", ""),
	}
	min, err := MinVersion(e.Raw(prefix + "_TLS_MIN_VERSION"))
	if err != nil {
		e.Fail(prefix+"_TLS_MIN_VERSION", "%v", err)
	}
	f.MinVersion = min
	if !on {
		for _, v := range []struct{ name, value string }{
			{prefix + "_TLS_CA_FILE", f.CAFile}, {prefix + "_TLS_CERT_FILE", f.CertFile},
			{prefix + "_TLS_KEY_FILE", f.KeyFile}, {prefix + "_TLS_SERVER_NAME", f.ServerName},
		} {
			if v.value != "" {
				e.Fail(v.name, "is set but %s_TLS is not true (set %s_TLS=true to connect with TLS)", prefix, prefix)
			}
		}
	}
	return on, f
}

// ClientFromEnv is the client TLS configuration of one backend read by
// FilesFromEnv, its files loaded now; nil when TLS is off or a problem was
// recorded on e.
func ClientFromEnv(e *envconfig.Reader, prefix string) *tls.Config {
	on, f := FilesFromEnv(e, prefix)
	if !on {
		return nil
	}
	cfg, err := Client(f)
	FailEnv(e, prefix, err)
	return cfg
}

// FailEnv records each problem of Client (for the variables FilesFromEnv
// reads under prefix) on e, under the variable at fault.
func FailEnv(e *envconfig.Reader, prefix string, err error) {
	if err == nil {
		return
	}
	names := map[string]string{"CA": prefix + "_TLS_CA_FILE", "cert": prefix + "_TLS_CERT_FILE", "key": prefix + "_TLS_KEY_FILE"}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, err := range errs {
		var p *Problem
		if errors.As(err, &p) {
			e.Fail(names[p.Var], "%v", p.Err)
		} else {
			e.Fail(prefix+"_TLS", "%v", err)
		}
	}
}
