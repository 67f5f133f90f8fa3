package opsapi_test

import (
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const (
	aliceTok = "alice-token-0123456789"
	bobTok   = "bob-token-0123456789ab"
	carolTok = "carol-token-0123456789"
)

// writeFile replaces path's content, moving its modification time on so
// that a rewrite within the clock's granularity is seen as a change.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	old, _ := os.Stat(path)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if old != nil {
		mt := old.ModTime().Add(time.Second)
		if err := os.Chtimes(path, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOperatorIdentities: each token is an identity and a role; the
// identity (vouched for by usage-api's key) is the author whatever the
// body says; roles bound what a token may do; a line removed from the
// file stops its token at the next request, with no restart; a file that
// no longer parses refuses its tokens (USAGE_ADMIN_TOKEN still works).
func TestOperatorIdentities(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "tokens")
	writeFile(t, creds, "# operators\nalice policy "+aliceTok+"\nbob overrides "+bobTok+"\ncarol read "+carolTok+"\n")
	c, err := opsapi.NewCredentials(creds, admin)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var changes []string
	c.OnChange = func(err error) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, fmt.Sprint(err))
	}
	signer, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	ring, err := policylog.ParseKeyring(strings.NewReader(signer.KeyringLine("usage-api")))
	if err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	h, err := opsapi.New(opsapi.Config{Log: l, Credentials: c, Keys: policylog.Keys{Signer: signer, Ring: ring}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	a := api{t, srv.URL}

	code, body := a.do("PUT", "/v1/admin/policy", aliceTok, jsonBody(map[string]any{"document": docA, "message": "first", "author": "mallory"}))
	if code != 200 {
		t.Fatalf("alice pushes: %d %v", code, body)
	}
	if code, body = a.do("GET", "/v1/admin/policy", carolTok, ""); code != 200 || body["author"] != "usage-api/alice" {
		t.Fatalf("carol reads: %d, author %v; want 200, usage-api/alice", code, body["author"])
	}
	if code, body = a.do("PUT", "/v1/admin/overrides/acct_1", bobTok, jsonBody(map[string]any{"tier": "pro", "reason": "deal", "author": "alice"})); code != 200 {
		t.Fatalf("bob sets an override: %d %v", code, body)
	}
	if code, body = a.do("GET", "/v1/admin/overrides/acct_1", carolTok, ""); code != 200 || body["author"] != "usage-api/bob" {
		t.Fatalf("the override's author: %d %v", code, body["author"])
	}
	for _, c := range []struct{ who, tok, method, path, body string }{
		{"carol", carolTok, "PUT", "/v1/admin/overrides/acct_2", jsonBody(map[string]any{"tier": "pro", "reason": "x"})},
		{"carol", carolTok, "DELETE", "/v1/admin/overrides/acct_1?reason=x", ""},
		{"bob", bobTok, "PUT", "/v1/admin/policy", jsonBody(map[string]any{"document": docA + "# b\n", "message": "x"})},
		{"bob", bobTok, "POST", "/v1/admin/policy/rollback", jsonBody(map[string]any{"revision": 1, "message": "x"})},
	} {
		if code, body := a.do(c.method, c.path, c.tok, c.body); code != 403 {
			t.Errorf("%s %s %s: %d %v, want 403", c.who, c.method, c.path, code, body)
		}
	}
	code, body = a.do("GET", "/v1/admin/policy/history", aliceTok, "")
	if n := len(body["entries"].([]any)); code != 200 || n != 2 {
		t.Fatalf("history after the refused writes: %d, %d entries (want 2: nothing refused was written)", code, n)
	}

	// Bob's line removed: his token stops at once, the others go on.
	writeFile(t, creds, "alice policy "+aliceTok+"\ncarol read "+carolTok+"\n")
	if code, _ := a.do("GET", "/v1/admin/overrides", bobTok, ""); code != 401 {
		t.Fatalf("bob after his line was removed: %d, want 401", code)
	}
	if code, _ := a.do("GET", "/v1/admin/overrides", carolTok, ""); code != 200 {
		t.Fatalf("carol after bob's line was removed: %d", code)
	}
	// A file that no longer parses: its tokens are refused, the admin's
	// is not; fixed, they work again.
	writeFile(t, creds, "alice policy "+aliceTok+"\ncarol reader "+carolTok+"\n")
	if code, body := a.do("GET", "/v1/admin/overrides", aliceTok, ""); code != 401 || !strings.Contains(body["error"].(map[string]any)["message"].(string), "line 2") {
		t.Fatalf("alice with a broken file: %d %v", code, body)
	}
	if code, _ := a.do("GET", "/v1/admin/overrides", admin, ""); code != 200 {
		t.Fatalf("USAGE_ADMIN_TOKEN with a broken file: %d", code)
	}
	writeFile(t, creds, "alice policy "+aliceTok+"\n")
	if code, _ := a.do("GET", "/v1/admin/overrides", aliceTok, ""); code != 200 {
		t.Fatalf("alice once the file is fixed: %d", code)
	}
	mu.Lock()
	got := strings.Join(changes, " | ")
	mu.Unlock()
	if len(changes) != 3 || changes[0] != "<nil>" || !strings.Contains(changes[1], "line 2") || changes[2] != "<nil>" || strings.Contains(got, carolTok) {
		t.Fatalf("changes reported: %q; want loaded, refused (line 2), loaded, naming no token", got)
	}
	if code, body = a.do("DELETE", "/v1/admin/overrides/acct_1?reason=done&author=bob", admin, ""); code != 200 {
		t.Fatalf("admin deletes: %d %v", code, body)
	}
	code, body = a.do("GET", "/v1/admin/policy/history", admin, "")
	entries := body["entries"].([]any)
	if last := entries[len(entries)-1].(map[string]any); code != 200 || last["author"] != "usage-api/admin" {
		t.Fatalf("the delete's author: %v", last["author"])
	}
}

// TestCredentialsFile: what a credentials file may hold; no error names
// a token.
func TestCredentialsFile(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{
		"alice policy",
		"alice root " + aliceTok,
		"alice policy tiny12",
		"al/ice policy " + aliceTok,
		"alice policy " + aliceTok + "\nbob read " + aliceTok,
		"alice policy " + admin,
	} {
		p := filepath.Join(dir, "f")
		writeFile(t, p, bad+"\n")
		_, err := opsapi.NewCredentials(p, admin)
		if err == nil {
			t.Errorf("%q: accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), aliceTok) || strings.Contains(err.Error(), admin) || strings.Contains(err.Error(), "tiny12") {
			t.Errorf("%q: the error names a token: %v", bad, err)
		}
	}
	if _, err := opsapi.NewCredentials("", ""); err == nil {
		t.Error("no credential at all: accepted")
	}
}
