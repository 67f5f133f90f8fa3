package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
)

func TestHeaderModeVariables(t *testing.T) {
	c, err := loadConfig(func(string) string { return "" })
	if err != nil || c.Headers != ratelimitheader.Both || c.EnvoyHeaders != ratelimitheader.Legacy {
		t.Fatalf("defaults: /check %v, Envoy %v (%v)", c.Headers, c.EnvoyHeaders, err)
	}
	env := map[string]string{"LIMITER_HEADERS": "ietf", "LIMITER_ENVOY_HEADERS": "Draft"}
	_, err = loadConfig(func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "LIMITER_HEADERS") || !strings.Contains(err.Error(), "LIMITER_ENVOY_HEADERS") {
		t.Fatalf("bad modes: %v", err)
	}
}

// The binary hands LIMITER_HEADERS to /check and LIMITER_ENVOY_HEADERS to
// the Envoy service.
func TestHeaderModesReachTheFrontDoors(t *testing.T) {
	p, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "LIMITER_HEADERS=draft", "LIMITER_ENVOY_HEADERS=draft")
	resp, err := client.Post(p.url+"/check", "application/json", strings.NewReader(`{"key":"acct_h","scope":"api:x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var d struct{ Headers map[string]string }
	if err := json.Unmarshal(body, &d); err != nil || d.Headers["RateLimit-Policy"] != `"free";q=3;w=18` || d.Headers["RateLimit-Limit"] != "" {
		t.Fatalf("/check with LIMITER_HEADERS=draft: %s (%v)", body, err)
	}
	h := headerMap(rls(t, rlsv3.NewRateLimitServiceClient(dial(t, addr)), "edge", 0, desc("remote_address", "203.0.113.9")))
	if h["ratelimit-policy"] == "" || h["ratelimit-limit"] != "" {
		t.Fatalf("Envoy with LIMITER_ENVOY_HEADERS=draft: %v", h)
	}
}
