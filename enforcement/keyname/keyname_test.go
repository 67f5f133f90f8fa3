package keyname_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement/keyname"
)

func TestNames(t *testing.T) {
	a, b := keyname.New([]byte("secret-a")), keyname.New([]byte("secret-b"))
	key := "ip:203.0.113.7"
	n := a.Name(key)
	if len(n) != 16 || strings.Contains(n, "203") || n == key {
		t.Fatalf("name %q of %q", n, key)
	}
	if keyname.New([]byte("secret-a")).Name(key) != n {
		t.Fatal("the same secret named the same key differently")
	}
	if b.Name(key) == n || a.Name(key+"x") == n {
		t.Fatal("another secret, or another key, gave the same name")
	}
	r1, r2 := keyname.Random(), keyname.Random()
	if r1.Name(key) == r2.Name(key) || r1.Name(key) != r1.Name(key) || len(r1.Name(key)) != 16 {
		t.Fatal("random secrets: one per namer, stable within it")
	}
	if raw := keyname.Raw(); raw.Name(key) != key || !raw.IsRaw() || a.IsRaw() {
		t.Fatal("raw names are the keys")
	}
	// HMAC-SHA256("secret-a", key), first 8 bytes: the name is the
	// standard construction, so an operator can compute it elsewhere
	// (openssl dgst -sha256 -hmac secret-a).
	// (printf %s ip:203.0.113.7 | openssl dgst -sha256 -hmac secret-a).
	if n != "3e3b8f1b411886ab" {
		t.Fatalf("name %q, want HMAC-SHA256's first 8 bytes in hex", n)
	}
}
