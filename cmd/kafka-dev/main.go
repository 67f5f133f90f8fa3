// Command kafka-dev runs a Kafka-protocol broker (kfake) on a fixed
// loopback port with the decisions topic created, for `make up` and local
// experiments. With KAFKA_DEV_DATA_DIR its topics (the policy log, the
// decisions) survive a restart; without it nothing is persisted.
//
//	KAFKA_DEV_ADDR        listen address, default 127.0.0.1:9092 (loopback only)
//	KAFKA_TOPIC           topic to create, default ratelimit.decisions
//	KAFKA_DEV_PARTITIONS  partitions of the topic, default 4
//	KAFKA_DEV_DATA_DIR    where the broker keeps its data (make up: run/kafka); empty = in memory
//
// A secure local stack (the settings of a managed Kafka, to try the
// services' KAFKA_SASL_* and KAFKA_TLS* against):
//
//	KAFKA_DEV_SASL_USERNAME    switches SASL on: every client must log in as this user
//	KAFKA_DEV_SASL_PASSWORD    its password (or KAFKA_DEV_SASL_PASSWORD_FILE)
//	KAFKA_DEV_SASL_MECHANISMS  comma-separated: plain, scram-sha-256, scram-sha-512
//	                           (default all three)
//	KAFKA_DEV_TLS_CERT_FILE    with KAFKA_DEV_TLS_KEY_FILE: the listener speaks TLS
//	                           only, with this certificate (PEM)
//	KAFKA_DEV_TLS_CLIENT_CA_FILE  clients must present a certificate signed by this CA
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the broker until SIGTERM or SIGINT and returns the exit code.
func serve() int {
	return lifecycle.Main("kafka-dev", config, run)
}

// run serves the broker until ctx ends.
func run(ctx context.Context, cfg kafkadev.Config, log *slog.Logger) error {
	b, err := kafkadev.Start(cfg)
	if err != nil {
		return fmt.Errorf("start broker: %w", err)
	}
	log.Info("kafka-dev broker listening", "addr", b.Addr(), "topic", cfg.Topic, "partitions", cfg.Partitions, "data_dir", cfg.DataDir,
		"tls", cfg.TLS != nil, "sasl_users", fmt.Sprint(cfg.Users))
	<-ctx.Done()
	b.Close()
	log.Info("kafka-dev broker stopped")
	return nil
}

func config(getenv func(string) string) (kafkadev.Config, error) {
	addr := getenv("KAFKA_DEV_ADDR")
	if addr == "" {
		addr = "127.0.0.1:9092"
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_ADDR=%q: %v", addr, err)
	}
	if host != "127.0.0.1" && host != "localhost" {
		return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_ADDR=%q: the dev broker listens on 127.0.0.1 only", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_ADDR=%q: bad port", addr)
	}
	topic := getenv("KAFKA_TOPIC")
	if topic == "" {
		topic = "ratelimit.decisions"
	}
	parts := 4
	if s := getenv("KAFKA_DEV_PARTITIONS"); s != "" {
		parts, err = strconv.Atoi(s)
		if err != nil || parts < 1 || parts > 1024 {
			return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_PARTITIONS=%q: want an integer 1..1024", s)
		}
	}
	cfg := kafkadev.Config{Port: port, Topic: topic, Partitions: parts, DataDir: getenv("KAFKA_DEV_DATA_DIR")}
	e := envconfig.New(getenv)
	cfg.Users = users(e)
	cfg.TLS = serverTLS(e)
	return cfg, e.Err()
}

// users are the broker's SASL users: one user, under each mechanism asked for.
func users(e *envconfig.Reader) []kafkadev.User {
	name := e.String("KAFKA_DEV_SASL_USERNAME", "")
	password := e.Secret("KAFKA_DEV_SASL_PASSWORD")
	mechs := e.List("KAFKA_DEV_SASL_MECHANISMS")
	if name == "" {
		if password != "" || len(mechs) > 0 {
			e.Fail("KAFKA_DEV_SASL_USERNAME", "required with KAFKA_DEV_SASL_PASSWORD or KAFKA_DEV_SASL_MECHANISMS")
		}
		return nil
	}
	if password == "" {
		e.Fail("KAFKA_DEV_SASL_PASSWORD", "required with KAFKA_DEV_SASL_USERNAME (or KAFKA_DEV_SASL_PASSWORD_FILE)")
		return nil
	}
	if len(mechs) == 0 {
		mechs = []string{"plain", "scram-sha-256", "scram-sha-512"}
	}
	var out []kafkadev.User
	for _, m := range mechs {
		switch m = strings.ToLower(m); m {
		case "plain", "scram-sha-256", "scram-sha-512":
			out = append(out, kafkadev.User{Mechanism: strings.ToUpper(m), Name: name, Password: password})
		default:
			e.Fail("KAFKA_DEV_SASL_MECHANISMS", "%q is not plain, scram-sha-256 or scram-sha-512", m)
		}
	}
	return out
}

// serverTLS is the listener's TLS configuration, nil for plaintext.
func serverTLS(e *envconfig.Reader) *tls.Config {
	cert, key := e.String("KAFKA_DEV_TLS_CERT_FILE", ""), e.String("KAFKA_DEV_TLS_KEY_FILE", "")
	clientCA := e.String("KAFKA_DEV_TLS_CLIENT_CA_FILE", "")
	if cert == "" && key == "" {
		if clientCA != "" {
			e.Fail("KAFKA_DEV_TLS_CLIENT_CA_FILE", "needs KAFKA_DEV_TLS_CERT_FILE and KAFKA_DEV_TLS_KEY_FILE")
		}
		return nil
	}
	if cert == "" || key == "" {
		e.Fail("KAFKA_DEV_TLS_CERT_FILE", "and KAFKA_DEV_TLS_KEY_FILE must be set together")
		return nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		e.Fail("KAFKA_DEV_TLS_CERT_FILE", "%s with key %s: %v", cert, key, err)
		return nil
	}
	c := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		b, err := os.ReadFile(clientCA)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(b) {
			e.Fail("KAFKA_DEV_TLS_CLIENT_CA_FILE", "%s: no PEM certificate (%v)", clientCA, err)
			return nil
		}
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, pool
	}
	return c
}
