package notify

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestEndpointsHotReload: a changed file is picked up, a broken one is
// refused while the previous content stays, and keys without an entry use
// the default endpoint.
func TestEndpointsHotReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write := func(body string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	def := Endpoint{URL: "http://default.example/hook", Key: []byte("0123456789abcdef")}
	e := &endpoints{def: def, path: path, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	t0 := time.Now().Add(-time.Hour)
	write(`endpoints: { acct_1: { url: "http://one.example/a" } }`, t0)
	if err := e.reload(); err != nil {
		t.Fatal(err)
	}
	if ep, ok := e.lookup("acct_1"); !ok || ep.URL != "http://one.example/a" {
		t.Fatalf("acct_1: %+v", ep)
	}
	if ep, ok := e.lookup("acct_2"); !ok || ep.URL != def.URL {
		t.Fatalf("acct_2 should use the default: %+v", ep)
	}
	write(`endpoints: { acct_1: { url: "http://two.example/b" }, acct_2: { url: "http://two.example/c" } }`, t0.Add(time.Second))
	if err := e.reload(); err != nil {
		t.Fatal(err)
	}
	if ep, _ := e.lookup("acct_2"); ep.URL != "http://two.example/c" {
		t.Fatalf("after reload acct_2: %+v", ep)
	}
	write(`endpoints: { acct_1: { url: "not a url" } }`, t0.Add(2*time.Second))
	if err := e.reload(); err == nil {
		t.Fatal("a broken file was accepted")
	}
	if ep, _ := e.lookup("acct_1"); ep.URL != "http://two.example/b" {
		t.Fatalf("a broken file replaced the previous content: %+v", ep)
	}
	noDefault := &endpoints{path: path, log: e.log}
	write(`endpoints: { acct_1: { url: "http://one.example/a", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" } }`, t0.Add(3*time.Second))
	if err := noDefault.reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := noDefault.lookup("acct_9"); ok {
		t.Fatal("a key without an entry and no default endpoint was given one")
	}
}
