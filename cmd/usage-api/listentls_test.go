package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestUsageAPIOverTLS: the usage-api binary with USAGE_API_TLS_CERT_FILE
// and USAGE_API_TLS_KEY_FILE serves HTTPS only, with its Redis reached over
// TLS as an ACL user (password as a file); SIGHUP serves a renewed
// certificate without a restart. ClickHouse is down on purpose: /healthz
// does not need it. The Redis password is in no log line.
func TestUsageAPIOverTLS(t *testing.T) {
	t.Parallel()
	const pw = "rw-usage-redis-pw-0e6a93f1"
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: pw, KeyPattern: "rl:*", ClientCerts: true})
	dir := t.TempDir()
	certFile, keyFile, pwFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "redis-password")
	copyTo(t, certs.ServerCert, certFile)
	copyTo(t, certs.ServerKey, keyFile)
	writeFileT(t, pwFile, pw+"\n")
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(filepath.Join(bins, "usage-api"))
	cmd.Env = append(os.Environ(),
		"USAGE_API_ADDR="+addr,
		"USAGE_API_TLS_CERT_FILE="+certFile, "USAGE_API_TLS_KEY_FILE="+keyFile,
		"USAGE_ADMIN_TOKEN=tls-admin-token-0123456789", "USAGE_TOKEN_SECRET=tls-secret-0123456789abcdef",
		fmt.Sprintf("CLICKHOUSE_ADDR=127.0.0.1:%d", testenv.FreePort(t)),
		"POLICY_FILE=../../deploy/policy.yaml",
		"REDIS_ADDRS="+r.Addr(), "REDIS_USERNAME=ratewarden", "REDIS_PASSWORD_FILE="+pwFile,
		"REDIS_TLS=true", "REDIS_TLS_CA_FILE="+certs.CAFile,
		"REDIS_TLS_CERT_FILE="+certs.ClientCert, "REDIS_TLS_KEY_FILE="+certs.ClientKey,
	)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("usage-api exited with %v after SIGTERM", err)
			}
		case <-time.After(testenv.Timeout(15 * time.Second)):
			cmd.Process.Kill()
			t.Error("usage-api did not stop within 15 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("usage-api logs:\n%s", tail(logs.String(), 4000))
		}
	})

	get := func(caFile string) (int, error) {
		pool := x509.NewCertPool()
		b, _ := os.ReadFile(caFile)
		pool.AppendCertsFromPEM(b)
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		resp, err := c.Get("https://" + addr + "/healthz")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("usage-api exited (%v): %s", err, logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("HTTPS /healthz with the certificate of the CA", func() bool { code, err := get(certs.CAFile); return err == nil && code == 200 })
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200")
		}
	}

	copyTo(t, certs.OtherServerCert, certFile)
	copyTo(t, certs.OtherServerKey, keyFile)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait("the renewed certificate after SIGHUP", func() bool { code, err := get(certs.OtherCAFile); return err == nil && code == 200 })
	if !strings.Contains(logs.String(), "re-read secrets and certificates on SIGHUP") {
		t.Errorf("the SIGHUP reload was not logged")
	}
	if strings.Contains(logs.String(), pw) {
		t.Fatal("the logs hold the Redis password")
	}
}

func copyTo(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFileT(t, to, string(b))
}
