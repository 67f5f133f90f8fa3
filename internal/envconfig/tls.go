package envconfig

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strconv"
	"strings"
)

// Bool is true/false (also 1/0, t/f, as strconv.ParseBool), or def.
func (r *Reader) Bool(name string, def bool) bool {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.Fail(name, "%q is not true or false", v)
		return def
	}
	return b
}

// ClientTLS is the TLS client configuration of one backend, read from
// prefix+"_TLS" ("true" enables it), prefix+"_TLS_CA_FILE" (PEM bundle the
// server's certificate must chain to; default: the system's roots) and
// prefix+"_TLS_CERT_FILE" with prefix+"_TLS_KEY_FILE" (a client
// certificate, both or neither). It is nil when TLS is off. The files are
// read now, so a missing or malformed one is a start-up error naming its
// variable; a file named while TLS is off is an error too (the operator
// meant TLS and would otherwise get plaintext).
func (r *Reader) ClientTLS(prefix string) *tls.Config {
	on := r.Bool(prefix+"_TLS", false)
	ca, cert, key := prefix+"_TLS_CA_FILE", prefix+"_TLS_CERT_FILE", prefix+"_TLS_KEY_FILE"
	caFile, certFile, keyFile := r.String(ca, ""), r.String(cert, ""), r.String(key, "")
	if !on {
		for _, v := range []string{ca, cert, key} {
			if r.String(v, "") != "" {
				r.Fail(v, "is set but %s_TLS is not true: set %s_TLS=true to connect with TLS", prefix, prefix)
			}
		}
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			r.Fail(ca, "%v", err)
		} else {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				r.Fail(ca, "%s holds no PEM certificate", caFile)
			}
			c.RootCAs = pool
		}
	}
	switch {
	case (certFile == "") != (keyFile == ""):
		r.Fail(cert, "and %s must be set together", key)
	case certFile != "":
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			// The error names the problem (no PEM data, mismatch), never
			// the key's bytes.
			r.Fail(cert, "client certificate %s with key %s: %v", certFile, keyFile, err)
		} else {
			c.Certificates = []tls.Certificate{pair}
		}
	}
	return c
}
