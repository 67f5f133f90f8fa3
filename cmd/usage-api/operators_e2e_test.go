package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestOperatorIdentitiesE2E: the usage-api binary with
// USAGE_ADMIN_TOKENS_FILE and its own signing key. A write's author is
// the credential's identity (vouched for by usage-api's key) whatever the
// body says; the limiter CLI, reading by the same keyring, sees that
// author; a line removed from the file stops its token with no restart.
func TestOperatorIdentitiesE2E(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	dir := t.TempDir()
	line, err := exec.Command(filepath.Join(bins, "limiter"), "policy", "keygen", "usage-api", "--out", filepath.Join(dir, "api.pem")).Output()
	if err != nil {
		t.Fatalf("keygen: %v", err)
	}
	keyring := filepath.Join(dir, "keyring")
	tokens := filepath.Join(dir, "tokens")
	for path, content := range map[string]string{
		keyring: string(line),
		tokens:  "alice policy alice-e2e-token-0123456789\nbob overrides bob-e2e-token-0123456789\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const admin = "e2e-admin-token-0123456789"
	api := start(t, "usage-api", "USAGE_API_ADDR", "/healthz",
		fmt.Sprintf("CLICKHOUSE_ADDR=127.0.0.1:%d", testenv.FreePort(t)), "CLICKHOUSE_DATABASE=e2e",
		"USAGE_ADMIN_TOKEN="+admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef", "USAGE_QUERY_TIMEOUT=2s",
		"KAFKA_BROKERS="+k.Addr(), "USAGE_ADMIN_TOKENS_FILE="+tokens,
		"POLICY_SIGNING_KEY_FILE="+filepath.Join(dir, "api.pem"), "POLICY_TRUSTED_KEYS_FILE="+keyring)

	doc, _ := json.Marshal(map[string]any{"document": e2ePolicy, "message": "first", "author": "mallory"})
	if code, b := call(t, "PUT", api.url+"/v1/admin/policy", "alice-e2e-token-0123456789", string(doc)); code != 200 {
		t.Fatalf("alice pushes: %d %s", code, b)
	}
	if code, b := call(t, "PUT", api.url+"/v1/admin/overrides/acct_9", "bob-e2e-token-0123456789",
		`{"tier": "pro", "reason": "deal", "author": "alice"}`); code != 200 {
		t.Fatalf("bob sets an override: %d %s", code, b)
	}
	if code, b := call(t, "PUT", api.url+"/v1/admin/policy", "bob-e2e-token-0123456789", string(doc)); code != 403 {
		t.Fatalf("bob pushes a document: %d %s, want 403", code, b)
	}
	cli := exec.Command(filepath.Join(bins, "limiter"), "override", "get", "acct_9", "--json")
	cli.Env = append(os.Environ(), "KAFKA_BROKERS="+k.Addr(), "POLICY_TRUSTED_KEYS_FILE="+keyring)
	out, err := cli.Output()
	var ov []struct{ Author string }
	if err != nil || json.Unmarshal(out, &ov) != nil || len(ov) != 1 || ov[0].Author != "usage-api/bob" {
		t.Fatalf("the override as the CLI reads it: %v %s (want one, by usage-api/bob)", err, out)
	}

	// Bob's line removed: refused at his next request, usage-api still
	// running; alice goes on.
	st, _ := os.Stat(tokens)
	if err := os.WriteFile(tokens, []byte("alice policy alice-e2e-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mt := st.ModTime().Add(time.Second) // a change within the clock's granularity is still seen
	if err := os.Chtimes(tokens, mt, mt); err != nil {
		t.Fatal(err)
	}
	if code, b := call(t, "GET", api.url+"/v1/admin/overrides", "bob-e2e-token-0123456789", ""); code != 401 {
		t.Fatalf("bob after his line was removed: %d %s", code, b)
	}
	if code, b := call(t, "GET", api.url+"/v1/admin/overrides", "alice-e2e-token-0123456789", ""); code != 200 || !strings.Contains(string(b), `"usage-api/bob"`) {
		t.Fatalf("alice lists: %d %s", code, b)
	}
}
