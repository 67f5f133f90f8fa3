package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testcerts"
)

// SecureClickHouse is a clickhouse-server configured the way ClickHouse
// Cloud is reached: the secure native port (tcp_port_secure, TLS with a
// certificate from a CA the test made) and a user with a password
// (password_sha256_hex). The plaintext port and the password-less
// "default" user stay for the harness's own helpers (Conn, Database).
type SecureClickHouse struct {
	*ClickHouse
	SecurePort   int
	Certs        *testcerts.Set
	User         string
	Password     string
	PasswordFile string // holds Password, as a Kubernetes secret would
}

// SecureAddr is host:port of the secure native port.
func (s *SecureClickHouse) SecureAddr() string { return fmt.Sprintf("127.0.0.1:%d", s.SecurePort) }

// StartSecureClickHouse starts a SecureClickHouse for the test and stops it
// at cleanup.
func StartSecureClickHouse(tb testing.TB) *SecureClickHouse {
	tb.Helper()
	SkipShort(tb)
	dir := tb.TempDir()
	certs, pw, pwFile := secureSetup(tb, dir, "ch-pw-", "clickhouse-password")
	s := &SecureClickHouse{Certs: certs, User: "ratewarden", Password: pw, PasswordFile: pwFile}
	var err error
	if s.SecurePort, err = freePort(); err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256([]byte(s.Password))
	users := fmt.Sprintf(secureUsersXML, s.User, hex.EncodeToString(sum[:]))
	tlsXML := fmt.Sprintf(secureTLSXML, s.SecurePort, certs.ServerCertFile, certs.ServerKeyFile)
	s.ClickHouse, err = NewClickHouse(filepath.Join(dir, "server"), WithUsersXML(users), WithConfigXML(tlsXML))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	if err := waitTCP(s.SecureAddr(), 30*time.Second); err != nil {
		tb.Fatalf("secure native port: %v", err)
	}
	return s
}

// Env is a service's environment for the secure port as s.User with the
// password read from passwordFile (s.PasswordFile, or a file of the
// test's with another password), trusting the test's CA.
func (s *SecureClickHouse) Env(passwordFile string) []string {
	return []string{
		"CLICKHOUSE_ADDR=" + s.SecureAddr(), "CLICKHOUSE_USER=" + s.User,
		"CLICKHOUSE_PASSWORD_FILE=" + passwordFile,
		"CLICKHOUSE_TLS=true", "CLICKHOUSE_TLS_CA_FILE=" + s.Certs.CAFile,
	}
}

// The secure native port with OpenSSL's server settings (ClickHouse 18.16
// and current releases read the same elements). No dhParamsFile: ECDHE
// needs none.
const secureTLSXML = `    <tcp_port_secure>%d</tcp_port_secure>
    <openSSL>
        <server>
            <certificateFile>%s</certificateFile>
            <privateKeyFile>%s</privateKeyFile>
            <verificationMode>none</verificationMode>
            <loadDefaultCAFile>false</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
        </server>
    </openSSL>
`

// secureUsersXML: "default" without a password from loopback only (the
// harness), and the service's user with a SHA-256 password.
const secureUsersXML = `<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>10000000000</max_memory_usage>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
        <%s>
            <password_sha256_hex>%s</password_sha256_hex>
            <networks><ip>::/0</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </%[1]s>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
`
