package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/testcerts"
)

func TestConfig(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := config(env(nil))
	if err != nil || c.Port != 9092 || c.Topic != "ratelimit.decisions" || c.Partitions != 4 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, bad := range []map[string]string{
		{"KAFKA_DEV_ADDR": "0.0.0.0:9092"},
		{"KAFKA_DEV_ADDR": "127.0.0.1:x"},
		{"KAFKA_DEV_PARTITIONS": "0"},
	} {
		_, err := config(env(bad))
		var name string
		for k := range bad {
			name = k
		}
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%v: error %v does not name %s", bad, err, name)
		}
	}
}

func TestSecureConfig(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	certs, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := config(env(map[string]string{"KAFKA_DEV_SASL_USERNAME": "svc", "KAFKA_DEV_SASL_PASSWORD": "pw-1",
		"KAFKA_DEV_TLS_CERT_FILE": certs.ServerCertFile, "KAFKA_DEV_TLS_KEY_FILE": certs.ServerKeyFile,
		"KAFKA_DEV_TLS_CLIENT_CA_FILE": certs.CAFile}))
	if err != nil || len(c.Users) != 3 || c.TLS == nil || c.TLS.ClientCAs == nil {
		t.Fatalf("%+v %v", c, err)
	}
	if s := fmt.Sprint(c.Users); strings.Contains(s, "pw-1") {
		t.Fatalf("users print their password: %s", s)
	}
	c, err = config(env(map[string]string{"KAFKA_DEV_SASL_USERNAME": "svc", "KAFKA_DEV_SASL_PASSWORD": "pw-1", "KAFKA_DEV_SASL_MECHANISMS": "scram-sha-512"}))
	if err != nil || len(c.Users) != 1 || c.Users[0].Mechanism != "SCRAM-SHA-512" || c.TLS != nil {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []map[string]string{
		{"KAFKA_DEV_SASL_PASSWORD": "pw"},
		{"KAFKA_DEV_SASL_USERNAME": "svc"},
		{"KAFKA_DEV_SASL_USERNAME": "svc", "KAFKA_DEV_SASL_PASSWORD": "pw", "KAFKA_DEV_SASL_MECHANISMS": "gssapi"},
		{"KAFKA_DEV_TLS_CERT_FILE": certs.ServerCertFile},
		{"KAFKA_DEV_TLS_CERT_FILE": certs.ServerCertFile, "KAFKA_DEV_TLS_KEY_FILE": certs.CAFile},
		{"KAFKA_DEV_TLS_CLIENT_CA_FILE": certs.CAFile},
	} {
		if _, err := config(env(bad)); err == nil || !strings.Contains(err.Error(), "KAFKA_DEV_") {
			t.Errorf("%v: error %v", bad, err)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("%v: error holds the password: %v", bad, err)
		}
	}
}
