package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testcerts"
)

// SecureKafka is a kfake broker configured the way a managed Kafka is
// (SASL_SSL): a TLS-only listener with a certificate from a CA the test
// made, which also requires a client certificate, and one SASL user
// under PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 with a random password.
type SecureKafka struct {
	*Kafka
	Certs    *testcerts.Set
	Username string
	Password string
	// PasswordFile holds Password (as a Kubernetes secret would).
	PasswordFile string
}

// StartSecureKafka starts a SecureKafka for the test and stops it at cleanup.
func StartSecureKafka(tb testing.TB, topic string, partitions int) *SecureKafka {
	tb.Helper()
	SkipShort(tb)
	dir := tb.TempDir()
	certs, pw, pwFile := secureSetup(tb, dir, "kafka-pw-", "kafka-password")
	k := &SecureKafka{Certs: certs, Username: "ratewarden-svc", Password: pw, PasswordFile: pwFile}
	var users []kafkadev.User
	for _, m := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		users = append(users, kafkadev.User{Mechanism: m, Name: k.Username, Password: k.Password})
	}
	var err error
	k.Kafka, err = kafkadev.Start(kafkadev.Config{Topic: topic, Partitions: partitions, Users: users, TLS: certs.ServerTLS(true)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(k.Close)
	return k
}

// Env is a service's environment for this broker with SASL mechanism
// (plain, scram-sha-256 or scram-sha-512), the password read from
// passwordFile (k.PasswordFile, or a file of the test's with another
// password), TLS with the CA and the client certificate.
func (k *SecureKafka) Env(mechanism, passwordFile string) []string {
	return []string{
		"KAFKA_BROKERS=" + k.Addr(), "KAFKA_TOPIC=" + k.Topic(),
		"KAFKA_SASL_MECHANISM=" + mechanism, "KAFKA_SASL_USERNAME=" + k.Username,
		"KAFKA_SASL_PASSWORD_FILE=" + passwordFile,
		"KAFKA_TLS=true", "KAFKA_TLS_CA_FILE=" + k.Certs.CAFile,
		"KAFKA_TLS_CERT_FILE=" + k.Certs.ClientCertFile, "KAFKA_TLS_KEY_FILE=" + k.Certs.ClientKeyFile,
	}
}

// secureSetup is what every secured test server starts from: certificates
// in dir/certs and a random password (prefix + 24 hex digits, so a scan for
// it cannot match by chance), also written to dir/file the way a mounted
// Kubernetes secret is (with a trailing newline).
func secureSetup(tb testing.TB, dir, prefix, file string) (certs *testcerts.Set, password, passwordFile string) {
	tb.Helper()
	certs, err := testcerts.New(filepath.Join(dir, "certs"))
	if err != nil {
		tb.Fatal(err)
	}
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	password, passwordFile = prefix+hex.EncodeToString(pw), filepath.Join(dir, file)
	if err := os.WriteFile(passwordFile, []byte(password+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return certs, password, passwordFile
}
