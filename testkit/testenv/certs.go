package testenv

import (
	"path/filepath"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/testcerts"
)

// Certs are PEM files of a private CA made for one test (package
// testcerts): a server certificate for 127.0.0.1 and localhost, a client
// certificate, and a second, unrelated CA with a server certificate of its
// own (what "the wrong CA bundle" and "a renewed certificate" look like).
type Certs struct {
	Dir                             string
	CAFile                          string // the CA that signed everything below
	ServerCert, ServerKey           string // SANs: 127.0.0.1, ::1, localhost; also client auth (cluster bus, replicas)
	ClientCert, ClientKey           string // CN "client", client auth
	OtherCAFile                     string // a CA that signed nothing here
	OtherServerCert, OtherServerKey string // signed by the other CA, same SANs
}

// NewCerts generates the files in a fresh temporary directory.
func NewCerts(tb testing.TB) *Certs {
	tb.Helper()
	dir := tb.TempDir()
	set, err := testcerts.New(dir)
	if err != nil {
		tb.Fatal(err)
	}
	other, err := testcerts.New(filepath.Join(dir, "other"))
	if err != nil {
		tb.Fatal(err)
	}
	return &Certs{
		Dir:    dir,
		CAFile: set.CAFile, ServerCert: set.ServerCertFile, ServerKey: set.ServerKeyFile,
		ClientCert: set.ClientCertFile, ClientKey: set.ClientKeyFile,
		OtherCAFile: other.CAFile, OtherServerCert: other.ServerCertFile, OtherServerKey: other.ServerKeyFile,
	}
}
