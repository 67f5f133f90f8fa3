package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestAdminTokenRequiredBeyondLoopback: with no LIMITER_AUTH_TOKEN the
// limiter serves /admin/* only on loopback, unless LIMITER_ADMIN_INSECURE
// says otherwise.
func TestAdminTokenRequiredBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		fail bool
	}{
		{map[string]string{"LIMITER_ADDR": "0.0.0.0:8080"}, true},
		{map[string]string{"LIMITER_ADDR": ":8080"}, true},
		{map[string]string{"LIMITER_ADDR": "[::]:8080"}, true},
		{map[string]string{"LIMITER_ADDR": "10.1.2.3:8080"}, true},
		{map[string]string{"LIMITER_ADDR": "limiter.internal:8080"}, true},
		{map[string]string{"LIMITER_ADDR": "0.0.0.0:8080", "LIMITER_ADMIN_INSECURE": "maybe"}, true},
		{map[string]string{"LIMITER_ADDR": "0.0.0.0:8080", "LIMITER_AUTH_TOKEN": "t0ken"}, false},
		{map[string]string{"LIMITER_ADDR": "0.0.0.0:8080", "LIMITER_ADMIN_INSECURE": "true"}, false},
		{map[string]string{"LIMITER_ADDR": "127.0.0.1:8080"}, false},
		{map[string]string{"LIMITER_ADDR": "[::1]:8080"}, false},
		{map[string]string{"LIMITER_ADDR": "localhost:8080"}, false},
	} {
		_, err := loadConfig(func(k string) string { return tc.env[k] })
		switch {
		case tc.fail && (err == nil || !strings.Contains(err.Error(), "LIMITER_AUTH_TOKEN") && !strings.Contains(err.Error(), "LIMITER_ADMIN_INSECURE")):
			t.Errorf("%v: %v, want an error naming LIMITER_AUTH_TOKEN", tc.env, err)
		case !tc.fail && err != nil:
			t.Errorf("%v: %v", tc.env, err)
		}
	}
}

// TestBinaryRefusesOpenAdminBeyondLoopback: the built binary exits 2 with
// one line naming the variable, before it listens.
func TestBinaryRefusesOpenAdminBeyondLoopback(t *testing.T) {
	testenv.SkipShort(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, limiterBin)
	cmd.Env = append(os.Environ(), fmt.Sprintf("LIMITER_ADDR=0.0.0.0:%d", testenv.FreePort(t)), "LIMITER_AUTH_TOKEN=", "POLICY_FILE=../../deploy/policy.yaml")
	out, err := cmd.CombinedOutput()
	exit, ok := err.(*exec.ExitError)
	if !ok || exit.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2; output %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "LIMITER_AUTH_TOKEN") || !strings.Contains(lines[0], "LIMITER_ADMIN_INSECURE=true") {
		t.Fatalf("output %q: want one line naming LIMITER_AUTH_TOKEN and the way out", out)
	}
}

const exposurePolicy = `
version: 1
default_tier: big
tiers:
  big: { rate: 100000, burst: 100000 }
`

// hotKeyEntry is an entry of GET /admin/hot-keys.
type hotKeyEntry struct {
	Key       string `json:"key"`
	MetricKey string `json:"metricKey"`
}

func (p *limiterProc) hotKeys(t *testing.T, token string) (int, []hotKeyEntry) {
	t.Helper()
	req, _ := http.NewRequest("GET", p.url+"/admin/hot-keys", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Keys []hotKeyEntry `json:"keys"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Keys
}

func (p *limiterProc) metricsText(t *testing.T) string {
	t.Helper()
	resp, err := client.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMetricsCarryNoRawKey: after traffic on a key, /metrics names it by
// a keyed hash only (by default, under a random secret of the process;
// with LIMITER_METRICS_KEY_SECRET, HMAC-SHA256 under it, the same on every
// start), and /admin/hot-keys behind the token maps the hash to the key.
// LIMITER_METRICS_RAW_KEYS=true puts the raw key back.
func TestMetricsCarryNoRawKey(t *testing.T) {
	t.Parallel()
	const key, token = "ip:203.0.113.77", "admin-t0ken"
	mac := hmac.New(sha256.New, []byte("dashboards"))
	mac.Write([]byte(key))
	stable := hex.EncodeToString(mac.Sum(nil)[:8])
	for _, tc := range []struct {
		name string
		env  []string
		want string // the key label /metrics must carry; "" = any hash
	}{
		{"default", nil, ""},
		{"secret", []string{"LIMITER_METRICS_KEY_SECRET=dashboards"}, stable},
		{"raw", []string{"LIMITER_METRICS_RAW_KEYS=true"}, key},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startLimiter(t, exposurePolicy, append([]string{"LIMITER_AUTH_TOKEN=" + token}, tc.env...)...)
			for range 50 {
				p.checkAuth(t, token, key)
			}
			text := p.metricsText(t)
			if tc.want != key && strings.Contains(text, "203.0.113.77") {
				t.Fatalf("/metrics carries the raw key:\n%s", grepLines(text, "203.0.113.77"))
			}
			if st, _ := p.hotKeys(t, ""); st != http.StatusUnauthorized {
				t.Fatalf("/admin/hot-keys without the token: %d, want 401", st)
			}
			st, keys := p.hotKeys(t, token)
			if st != 200 || len(keys) == 0 || keys[0].Key != key {
				t.Fatalf("/admin/hot-keys: %d %+v", st, keys)
			}
			name := keys[0].MetricKey
			if tc.want != "" && name != tc.want {
				t.Fatalf("metric key %q, want %q", name, tc.want)
			}
			if tc.want == "" && (len(name) != 16 || name == key) {
				t.Fatalf("metric key %q: want a 16-digit keyed hash", name)
			}
			if !strings.Contains(text, `limiter_hot_key_ops_per_second{key="`+name+`"`) &&
				!strings.Contains(text, `key="`+name+`",rank="1"`) {
				t.Fatalf("/metrics has no hot-key series for %q:\n%s", name, grepLines(text, "limiter_hot_key"))
			}
		})
	}
}

// checkAuth posts one /check of key with the bearer token.
func (p *limiterProc) checkAuth(t *testing.T, token, key string) {
	t.Helper()
	req, _ := http.NewRequest("POST", p.url+"/check", strings.NewReader(fmt.Sprintf(`{"key":%q,"scope":"api"}`, key)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /check: %d", resp.StatusCode)
	}
}

func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
