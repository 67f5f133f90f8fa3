package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func caPool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s: no certificate", file)
	}
	return pool
}

// httpsStatus is the status of GET url with only the CAs of pool trusted
// (a fresh connection each time, so a renewed certificate is seen), or the
// error.
func httpsStatus(pool *x509.CertPool, url string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true,
	}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// grpcHealth asks the gRPC health service with creds.
func grpcHealth(addr string, creds credentials.TransportCredentials) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return 0, err
	}
	return r.Status, nil
}

// TestListenerTLS: with LIMITER_TLS_CERT_FILE and LIMITER_TLS_KEY_FILE,
// /check and the gRPC service answer over TLS only, with that certificate;
// after the files are replaced, SIGHUP makes new connections get the new
// certificate without a restart.
func TestListenerTLS(t *testing.T) {
	certs := testenv.NewCerts(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile(t, certs.ServerCert, certFile)
	copyFile(t, certs.ServerKey, keyFile)
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := startLimiter(t, faultPolicy, "LIMITER_TLS_CERT_FILE="+certFile, "LIMITER_TLS_KEY_FILE="+keyFile,
		"LIMITER_GRPC_ADDR="+grpcAddr)
	if !strings.HasPrefix(p.url, "https://") {
		t.Fatalf("url %s", p.url)
	}
	pool := caPool(t, certs.CAFile)
	tlsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := tlsClient.Post(p.url+"/check", "application/json", strings.NewReader(`{"key":"k","scope":"api","cost":1}`))
	if err != nil {
		t.Fatalf("/check over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Fatalf("/check over TLS: %d %+v", resp.StatusCode, resp.TLS)
	}
	// Plain text is not served (Go's TLS server answers 400 to it).
	if resp, err := client.Get("http://" + strings.TrimPrefix(p.url, "https://") + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200 on the TLS listener")
		}
	}
	if st, err := grpcHealth(grpcAddr, credentials.NewTLS(&tls.Config{RootCAs: pool})); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health over TLS: %v %v", st, err)
	}
	if _, err := grpcHealth(grpcAddr, insecure.NewCredentials()); err == nil {
		t.Fatal("gRPC in plain text answered on the TLS listener")
	}

	// Renewal: the files now hold a certificate of another CA.
	copyFile(t, certs.OtherServerCert, certFile)
	copyFile(t, certs.OtherServerKey, keyFile)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	other := caPool(t, certs.OtherCAFile)
	waitFor(t, "the renewed certificate served after SIGHUP", 30*time.Second, func() bool {
		code, err := httpsStatus(other, p.url+"/healthz")
		return err == nil && code == 200
	})
	if _, err := httpsStatus(pool, p.url+"/healthz"); err == nil {
		t.Fatal("the old certificate is still served")
	}
	if st, err := grpcHealth(grpcAddr, credentials.NewTLS(&tls.Config{RootCAs: other})); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health with the renewed certificate: %v %v", st, err)
	}
	mc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: other}}}
	resp, err = mc.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `limiter_secret_reloads_total{result="ok",what="listener-certificate"} 1`) {
		t.Errorf("the certificate reload was not counted:\n%s", metrics)
	}
}

// TestListenerTLSBadConfigStopsTheStart: a certificate without its key,
// or a key that does not match, stops the start naming the variable.
func TestListenerTLSBadConfigStopsTheStart(t *testing.T) {
	testenv.SkipShort(t) // runs the binary
	certs := testenv.NewCerts(t)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"LIMITER_TLS_CERT_FILE=" + certs.ServerCert}, "LIMITER_TLS_KEY_FILE"},
		{[]string{"LIMITER_TLS_KEY_FILE=" + certs.ServerKey}, "LIMITER_TLS_CERT_FILE"},
		{[]string{"LIMITER_TLS_CERT_FILE=" + certs.ServerCert, "LIMITER_TLS_KEY_FILE=" + certs.ClientKey}, "LIMITER_TLS_CERT_FILE"},
		{[]string{"LIMITER_TLS_CERT_FILE=" + certs.ServerCert, "LIMITER_TLS_KEY_FILE=" + filepath.Join(t.TempDir(), "nope")}, "LIMITER_TLS_KEY_FILE"},
	} {
		cmd := exec.Command(limiterBin)
		cmd.Env = append(append(os.Environ(), "LIMITER_GRPC_ADDR="), tc.env...)
		out, err := cmd.CombinedOutput()
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 {
			t.Fatalf("%v: exit %v, want 2; %s", tc.env, err, out)
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Fatalf("%v: output %q, want one line naming %s", tc.env, out, tc.want)
		}
	}
}
