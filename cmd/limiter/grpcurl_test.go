package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// grpcurlVersion is the grpcurl release the test builds: an outside
// client that knows nothing of this repository's code.
const grpcurlVersion = "v1.9.4"

// TestEnvoyRLSThroughGrpcurl: a user with nothing but grpcurl and the
// server's reflection lists the services, describes the API and gets a
// decision.
func TestEnvoyRLSThroughGrpcurl(t *testing.T) {
	bin := t.TempDir()
	install := exec.Command("go", "install", "github.com/fullstorydev/grpcurl/cmd/grpcurl@"+grpcurlVersion)
	install.Env = append(install.Environ(), "GOBIN="+bin, "GOFLAGS=")
	install.Dir = bin // outside this module: its go.mod is not touched
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install grpcurl: %v\n%s", err, out)
	}
	grpcurl := filepath.Join(bin, "grpcurl")
	_, addr := startEnvoyLimiter(t, envoyPolicy, "LIMITER_AUTH_TOKEN=tok")
	run := func(args ...string) (string, error) {
		out, err := exec.Command(grpcurl, append([]string{"-plaintext", "-max-time", "20"}, args...)...).CombinedOutput()
		return string(out), err
	}
	auth := []string{"-H", "authorization: Bearer tok"}

	out, err := run(append(auth, addr, "list")...)
	if err != nil || !strings.Contains(out, "envoy.service.ratelimit.v3.RateLimitService") || !strings.Contains(out, "grpc.health.v1.Health") {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}
	out, err = run(append(auth, addr, "describe", "envoy.service.ratelimit.v3.RateLimitService")...)
	if err != nil || !strings.Contains(out, "rpc ShouldRateLimit ( .envoy.service.ratelimit.v3.RateLimitRequest ) returns ( .envoy.service.ratelimit.v3.RateLimitResponse )") {
		t.Fatalf("grpcurl describe: %v\n%s", err, out)
	}
	req := `{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "203.0.113.7"}]}], "hits_addend": 2}`
	out, err = run(append(auth, "-d", req, addr, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")...)
	if err != nil {
		t.Fatalf("grpcurl ShouldRateLimit: %v\n%s", err, out)
	}
	var resp struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			Code           string `json:"code"`
			LimitRemaining int    `json:"limitRemaining"`
			CurrentLimit   struct {
				Name            string `json:"name"`
				RequestsPerUnit int    `json:"requestsPerUnit"`
				Unit            string `json:"unit"`
			} `json:"currentLimit"`
		} `json:"statuses"`
		Headers []struct{ Key, Value string } `json:"responseHeadersToAdd"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("grpcurl output is not the response: %v\n%s", err, out)
	}
	if resp.OverallCode != "OK" || len(resp.Statuses) != 1 || resp.Statuses[0].LimitRemaining != 1 ||
		resp.Statuses[0].CurrentLimit.Name != "anonymous" || resp.Statuses[0].CurrentLimit.Unit != "MINUTE" || len(resp.Headers) != 6 {
		t.Errorf("grpcurl ShouldRateLimit:\n%s", out)
	}
	// Without the token: refused, reflection included.
	if out, err := run(addr, "list"); err == nil || !strings.Contains(out, "Unauthenticated") {
		t.Errorf("grpcurl list without the token: %v\n%s", err, out)
	}
	// Health needs no token (the token here only reads the schema by reflection).
	out, err = run("-reflect-header", "authorization: Bearer tok", "-d", `{"service": "envoy.service.ratelimit.v3.RateLimitService"}`,
		addr, "grpc.health.v1.Health/Check")
	if err != nil || !strings.Contains(out, "SERVING") {
		t.Errorf("health through grpcurl: %v\n%s", err, out)
	}
}
