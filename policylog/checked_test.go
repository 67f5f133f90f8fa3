package policylog

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// TestCheckedVouchesForExactlyWhatWasChecked: a remembered check spares
// the signature check of the same value at the same offset under the same
// log key and key, and of nothing else; the file round-trips.
func TestCheckedVouchesForExactlyWhatWasChecked(t *testing.T) {
	s, err := GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	ring, err := ParseKeyring(strings.NewReader(s.KeyringLine("alice")))
	if err != nil {
		t.Fatal(err)
	}
	r := Record{Revision: 2, Parent: 1, Kind: KindOverride, Time: time.Unix(0, 0).UTC(), Key: "k", Override: &policy.Override{Tier: "pro", Reason: "r"}}
	r.Seal()
	v, err := s.Encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	st := NewState(false)
	st.Authenticate(ring)
	a := st.authenticate(Entry{Offset: 7, Key: r.LogKey(), Value: v}, nil)
	if !a.signed {
		t.Fatal(a.err)
	}
	prior := &Checked{entries: []checkedEntry{{off: 3}, {off: 7, sum: a.sum}}}
	path := filepath.Join(t.TempDir(), CheckedFile)
	if err := prior.Save(path); err != nil {
		t.Fatal(err)
	}
	if prior, err = LoadChecked(path); err != nil || prior.Len() != 2 {
		t.Fatalf("round trip: %v, %d", err, prior.Len())
	}
	// A forged signature on the same bytes: another value, another digest.
	bad := append([]byte(nil), v...)
	if i := len(bad) - 20; bad[i] == 'A' {
		bad[i] = 'B'
	} else {
		bad[i] = 'A'
	}
	for _, c := range []struct {
		name   string
		e      Entry
		ring   *Keyring
		signed bool
	}{
		{"the same value and offset", Entry{Offset: 7, Key: r.LogKey(), Value: v}, ring, true},
		{"another offset: checked again, holds", Entry{Offset: 8, Key: r.LogKey(), Value: v}, ring, true},
		{"another value at the offset", Entry{Offset: 7, Key: r.LogKey(), Value: bad}, ring, false},
		{"another log key", Entry{Offset: 7, Key: "override/other", Value: v}, ring, false},
		{"the key no longer trusted", Entry{Offset: 7, Key: r.LogKey(), Value: v}, &Keyring{byID: map[string]trustedKey{}}, false},
	} {
		st := NewState(false)
		st.Authenticate(c.ring)
		if got := st.authenticate(c.e, prior); got.signed != c.signed {
			t.Errorf("%s: signed %v (%v), want %v", c.name, got.signed, got.err, c.signed)
		}
	}
	// What vouching spares is the check itself: told that any digest was
	// checked, a bad signature would pass. (So the digest must match.)
	if _, _, _, err := ring.check(r.LogKey(), bad, func([16]byte) bool { return true }); err != nil {
		t.Fatalf("a vouched value is checked anyway: %v", err)
	}
	if _, _, _, err := ring.check(r.LogKey(), bad, nil); err == nil {
		t.Fatal("a bad signature held")
	}
}

// TestAuthenticateNeverPanics: every byte of a signed value replaced by
// each of a few characters, and every truncation: refused or accepted,
// never a panic (a reader must survive whatever the topic holds).
func TestAuthenticateNeverPanics(t *testing.T) {
	s, err := GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	ring, err := ParseKeyring(strings.NewReader(s.KeyringLine("alice")))
	if err != nil {
		t.Fatal(err)
	}
	r := Record{Revision: 1, Kind: KindPolicy, Document: "version: 1\n"}
	r.Seal()
	v, err := s.Encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for i := range v {
		for _, c := range []byte{'A', '=', '"', '}', ',', 0, 0xff, 'f'} {
			w := append([]byte(nil), v...)
			w[i] = c
			if _, _, err := ring.Authenticate(r.LogKey(), w); err == nil && w[i] != v[i] {
				accepted++
			}
		}
		ring.Authenticate(r.LogKey(), v[:i])
	}
	if accepted != 0 {
		t.Fatalf("%d altered values accepted", accepted)
	}
}
