package policylog

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// writersRecords are override records of every shape writers produce.
func writersRecords() []Record {
	t0 := time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.UTC)
	recs := []Record{
		{Revision: 2, Parent: 1, Kind: KindOverride, Author: "alice", Message: "upgrade", Time: t0, Key: "acct_1",
			Override: &policy.Override{Tier: "pro", Reason: "upgrade"}},
		{Revision: 3, Parent: 2, Kind: KindOverride, Author: "billing", Message: "deal", Time: t0.Add(time.Second), Key: "acct_1",
			Scope: "api:search", Override: &policy.Override{Rate: 120.5, Burst: 30, Period: "minute", Reason: "deal", Store: "big"}},
		{Revision: 4, Parent: 3, Kind: KindOverride, Author: "bob", Message: "trial", Time: t0, Key: "ip:1.2.3.4/32",
			Override: &policy.Override{Quota: 500, QuotaPeriod: "day", Expires: t0.Add(time.Hour), Reason: "trial"}},
		{Revision: 5, Parent: 4, Kind: KindOverride, Author: "bob", Message: "gone", Time: t0, Key: "acct_2", Deleted: true},
		{Revision: 4, Parent: 3, Kind: KindOverride, Author: "bob", Message: "restated", Time: t0, Key: "acct_3",
			Override: &policy.Override{Rate: 0.25, Burst: 1, Reason: "r"}, Restates: true, RefusedRevision: 9,
			RefusedSHA256: "00ff"},
		{Revision: 6, Parent: 5, Kind: KindOverride, Author: "", Message: "", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", 3600)),
			Key: "k", Override: &policy.Override{Rate: 1e20, Burst: 1 << 50, Reason: ""}},
	}
	for i := range recs {
		recs[i].Seal()
	}
	return recs
}

// TestFastDecodeTakesWritersRecords: every override record a writer
// encodes is taken by the fast path, which decodes it as encoding/json
// does.
func TestFastDecodeTakesWritersRecords(t *testing.T) {
	for i, r := range writersRecords() {
		b, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		fast, ok := decodeOverride(b)
		if !ok {
			t.Errorf("record %d not taken by the fast path: %s", i, b)
			continue
		}
		slow, err := decodeJSON(r.LogKey(), b)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Errorf("record %d: fast %+v, encoding/json %+v", i, fast, slow)
		}
		got, err := Decode(r.LogKey(), b)
		if err != nil || !reflect.DeepEqual(got, slow) {
			t.Errorf("record %d: Decode %+v, %v", i, got, err)
		}
	}
}

// TestFastDecodeLeavesTheRest: what the fast path cannot vouch for goes
// to encoding/json (same outcome as before it existed).
func TestFastDecodeLeavesTheRest(t *testing.T) {
	r := writersRecords()[1]
	b, _ := r.Encode()
	s := string(b)
	for i, v := range []string{
		s[:len(s)-1] + ` }`,                    // a space
		s + ` `,                                // trailing data
		`{"Revision"` + s[len(`{"revision"`):], // another case
		replaceOnce(s, `"burst":30`, `"burst":30.0`),                                 // a number as encoding/json does not write it
		replaceOnce(s, `"burst":30`, `"burst":0`),                                    // an empty member json.Marshal omits
		replaceOnce(s, `"author":"billing"`, `"author":"bi\u006cling"`),              // an escape
		replaceOnce(s, `"reason":"deal",`, ``),                                       // reason absent
		replaceOnce(s, `"scope":"api:search",`, `"scope":"api:search","scope":"x",`), // twice
		replaceOnce(s, `"kind":"override"`, `"kind":"policy"`),
	} {
		if _, ok := decodeOverride([]byte(v)); ok {
			t.Errorf("case %d taken by the fast path: %s", i, v)
		}
	}
	// The hash is the writer's: a record whose content changed is refused
	// as before.
	tampered := replaceOnce(s, `"burst":30`, `"burst":31`)
	if _, err := Decode(r.LogKey(), []byte(tampered)); err == nil {
		t.Errorf("a tampered record decoded")
	}
}

func replaceOnce(s, old, new string) string {
	for i := 0; i+len(old) <= len(s); i++ {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	panic("no " + old)
}

// FuzzFastDecodeAgreesWithJSON: whatever the fast path reads (before its
// hash check, which a fuzzer's mutations rarely pass), encoding/json reads
// to the same record, whose Content is the bytes the fast path hashes.
func FuzzFastDecodeAgreesWithJSON(f *testing.F) {
	for _, r := range writersRecords() {
		b, _ := r.Encode()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, content, ok := parseOverride(b, nil)
		if !ok {
			return
		}
		var slow Record
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&slow); err != nil {
			t.Fatalf("fast path took %q, encoding/json: %v", b, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", b, fast, slow)
		}
		if c := slow.Content(); !bytes.Equal(c, content) {
			t.Fatalf("%q: fast path hashes %q, Content is %q", b, content, c)
		}
	})
}

// TestFastDecodeTakesSignedRecords: a signed override record (its
// "sig" member) stays on the fast path.
func TestFastDecodeTakesSignedRecords(t *testing.T) {
	s, err := GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range writersRecords() {
		v, err := s.Encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeOverride(v)
		if !ok {
			t.Fatalf("record %d: not taken by the fast path: %s", i, v)
		}
		want, err := decodeJSON(r.LogKey(), v)
		if err != nil || !reflect.DeepEqual(got, want) || !strings.HasPrefix(got.Sig, s.KeyID()+":") {
			t.Fatalf("record %d: fast %+v, json %+v (%v)", i, got, want, err)
		}
	}
}
