// Package testcerts makes a throwaway certificate authority and the server
// and client certificates the tests' TLS servers (redis-server and its
// Sentinels and Cluster bus, the kfake broker, clickhouse-server, the
// limiter's and usage API's own listeners) and clients need, written as PEM
// files the way an operator would mount them. Keys are ECDSA P-256;
// everything is valid for a day. For tests and the local stack only.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Set is a CA and one server and one client certificate signed by it, with
// the PEM files in Dir.
type Set struct {
	Dir string

	CAFile         string // the CA certificate (what clients trust)
	ServerCertFile string // for 127.0.0.1 and localhost
	ServerKeyFile  string
	ClientCertFile string // CN "client", for mutual TLS
	ClientKeyFile  string

	CAPool *x509.CertPool
	Server tls.Certificate
	Client tls.Certificate
}

// New writes a fresh set into dir (created if missing). A server certificate
// is for 127.0.0.1, ::1 and localhost; extraHosts adds DNS names.
func New(dir string, extraHosts ...string) (*Set, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ratewarden test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("testcerts: CA: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	s := &Set{Dir: dir, CAPool: x509.NewCertPool()}
	s.CAPool.AddCert(ca)
	s.CAFile = filepath.Join(dir, "ca.pem")
	if err := writePEM(s.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(cn string, usage []x509.ExtKeyUsage, dns []string, ips []net.IP, certFile, keyFile string) (tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  usage,
			DNSNames:     dns,
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("testcerts: %s: %w", cn, err)
		}
		kb, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return tls.Certificate{}, err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return tls.Certificate{}, err
		}
		if err := writePEM(keyFile, "PRIVATE KEY", kb); err != nil {
			return tls.Certificate{}, err
		}
		return tls.LoadX509KeyPair(certFile, keyFile)
	}
	s.ServerCertFile, s.ServerKeyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	// A server certificate is also the client certificate of a Redis node
	// on the cluster bus and of a replica (tls-cluster, tls-replication).
	s.Server, err = leaf("localhost", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, append([]string{"localhost"}, extraHosts...),
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, s.ServerCertFile, s.ServerKeyFile)
	if err != nil {
		return nil, err
	}
	s.ClientCertFile, s.ClientKeyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	s.Client, err = leaf("client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil, s.ClientCertFile, s.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// ServerTLS is a server configuration with the server certificate; when
// requireClientCert is set, clients must present a certificate signed by
// the CA.
func (s *Set) ServerTLS(requireClientCert bool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{s.Server}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = s.CAPool
	}
	return c
}

// ClientTLS is a client configuration that trusts the CA (and presents the
// client certificate).
func (s *Set) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: s.CAPool, Certificates: []tls.Certificate{s.Client}, MinVersion: tls.VersionTLS12}
}

// serial is a random serial number: two sets (a test's "other CA") must
// not share issuer and serial.
func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("testcerts: %w", err)
	}
	return nil
}
