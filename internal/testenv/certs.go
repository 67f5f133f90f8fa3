package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs are PEM files of a private CA made for one test: a server
// certificate for 127.0.0.1 and localhost, a client certificate, and a
// second, unrelated CA (what "the wrong CA bundle" looks like).
type Certs struct {
	Dir                             string
	CAFile                          string // the CA that signed everything below
	ServerCert, ServerKey           string // SANs: 127.0.0.1, ::1, localhost
	ClientCert, ClientKey           string // CN "ratewarden-client", client auth
	OtherCAFile                     string // a CA that signed nothing here
	OtherServerCert, OtherServerKey string // signed by the other CA, same SANs
}

// NewCerts generates the files in a fresh temporary directory (ECDSA P-256,
// valid from an hour ago for a day).
func NewCerts(tb testing.TB) *Certs {
	tb.Helper()
	c, err := GenerateCerts(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// GenerateCerts is NewCerts for TestMain and tools: the files go in dir.
func GenerateCerts(dir string) (*Certs, error) {
	c := &Certs{Dir: dir}
	ca, caKey, err := newCA("ratewarden test CA")
	if err != nil {
		return nil, err
	}
	other, otherKey, err := newCA("some other CA")
	if err != nil {
		return nil, err
	}
	write := func(name string, blockType string, der []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600)
	}
	if c.CAFile, err = write("ca.pem", "CERTIFICATE", ca.Raw); err != nil {
		return nil, err
	}
	if c.OtherCAFile, err = write("other-ca.pem", "CERTIFICATE", other.Raw); err != nil {
		return nil, err
	}
	leaf := func(prefix, cn string, usage []x509.ExtKeyUsage, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
		}
		if usage[0] == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		if err != nil {
			return "", "", err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", "", err
		}
		cp, err := write(prefix+".pem", "CERTIFICATE", der)
		if err != nil {
			return "", "", err
		}
		kp, err := write(prefix+"-key.pem", "EC PRIVATE KEY", kder)
		return cp, kp, err
	}
	// A server certificate is also the client certificate of a node on
	// the cluster bus and of a replica (tls-cluster, tls-replication).
	serverUsage := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if c.ServerCert, c.ServerKey, err = leaf("server", "localhost", serverUsage, ca, caKey); err != nil {
		return nil, err
	}
	if c.ClientCert, c.ClientKey, err = leaf("client", "ratewarden-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, ca, caKey); err != nil {
		return nil, err
	}
	if c.OtherServerCert, c.OtherServerKey, err = leaf("other-server", "localhost", serverUsage, other, otherKey); err != nil {
		return nil, err
	}
	return c, nil
}

func newCA(cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
