package policylog_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

func newSigner(t *testing.T) *policylog.Signer {
	t.Helper()
	s, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func keyring(t *testing.T, lines ...string) *policylog.Keyring {
	t.Helper()
	k, err := policylog.ParseKeyring(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func signed(t *testing.T, s *policylog.Signer, off int64, r policylog.Record) policylog.Entry {
	t.Helper()
	b, err := s.Encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	return policylog.Entry{Offset: off, Key: r.LogKey(), Value: b}
}

// TestKeyringJudgesEveryRecord: with a keyring, a record signed by a key
// in it is applied with the key's identity as its author (whatever it
// names), and one unsigned, signed by another key, altered after signing
// (its content hash made to match again), moved to another log key, or
// carrying another record's signature is refused unauthenticated.
func TestKeyringJudgesEveryRecord(t *testing.T) {
	alice, eve := newSigner(t), newSigner(t)
	keys := keyring(t, "# writers", alice.KeyringLine("alice"), "")
	good := signed(t, alice, 0, doc(1, 0, docA, "mallory"))

	altered := signed(t, alice, 1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"}))
	forgedRec := ovr(2, 1, "acct_1", "", &policy.Override{Tier: "free", Reason: "r"}) // the hash sealed again
	forgedJSON, _ := forgedRec.Encode()
	i := bytes.LastIndex(altered.Value, []byte(`,"sig":`))
	j := bytes.LastIndex(forgedJSON, []byte(`}`))
	altered.Value = append(append([]byte{}, forgedJSON[:j]...), altered.Value[i:]...)

	moved := signed(t, alice, 1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"}))
	movedRec := ovr(2, 1, "acct_2", "", &policy.Override{Tier: "pro", Reason: "r"})
	moved.Key = movedRec.LogKey()

	spliced := entry(1, ovr(2, 1, "acct_9", "", &policy.Override{Tier: "pro", Reason: "r"}))
	other := signed(t, alice, 1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"}))
	k := bytes.LastIndex(other.Value, []byte(`,"sig":`))
	spliced.Value = append(spliced.Value[:len(spliced.Value)-1], other.Value[k:]...)

	for _, c := range []struct {
		name   string
		e      policylog.Entry
		reason string
	}{
		{"unsigned", entry(1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"})), "not signed"},
		{"unknown key", signed(t, eve, 1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"})), "which the keyring does not hold"},
		{"altered", altered, "does not match"},
		{"moved", moved, "does not match"},
		{"another's signature", spliced, "does not match"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := policylog.NewState(true)
			s.Authenticate(keys)
			if o := s.Apply(good); o.Result != policylog.Applied || o.Record.Author != "alice/mallory" {
				t.Fatalf("signed record: %s %s %q, author %q; want applied, author alice/mallory", o.Result, o.Code, o.Reason, o.Record.Author)
			}
			o := s.Apply(c.e)
			if o.Result != policylog.Refused || o.Code != policylog.CodeUnauthenticated || !strings.Contains(o.Reason, c.reason) {
				t.Fatalf("got %s %s %q, want refused %s with %q", o.Result, o.Code, o.Reason, policylog.CodeUnauthenticated, c.reason)
			}
			if o.Record.Author != "" || s.Head() != 1 || s.Overrides() != 0 {
				t.Fatalf("author %q head %d overrides %d: the refused record left a trace", o.Record.Author, s.Head(), s.Overrides())
			}
		})
	}

	// Without a keyring, the same signed record decodes as before (the
	// fast path included) and names its own author.
	s := policylog.NewState(false)
	if o := s.Apply(good); o.Result != policylog.Applied || o.Record.Author != "mallory" {
		t.Fatalf("no keyring: %s %q, author %q", o.Result, o.Reason, o.Record.Author)
	}
	ov := signed(t, alice, 1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"}))
	if o := s.Apply(ov); o.Result != policylog.Applied {
		t.Fatalf("no keyring, signed override: %s %q", o.Result, o.Reason)
	}
}

// TestRetiredAndRemovedKeys is the rule for a key taken out of use: one
// retired with until=N still vouches for its records up to N for every
// reader, a reader that starts later included, and for nothing after; one
// removed from the keyring is judged by each reader when it reads: a
// reader that applied its records keeps them, one that reads them
// afterwards refuses them (and what was written on top, as conflicts).
func TestRetiredAndRemovedKeys(t *testing.T) {
	old, cur := newSigner(t), newSigner(t)
	log := []policylog.Entry{
		signed(t, old, 0, doc(1, 0, docA, "x")),
		signed(t, old, 1, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"})),
		signed(t, cur, 2, ovr(3, 2, "acct_2", "", &policy.Override{Tier: "pro", Reason: "r"})),
		signed(t, old, 3, ovr(4, 3, "acct_3", "", &policy.Override{Tier: "pro", Reason: "r"})), // after retirement
	}
	read := func(keys *policylog.Keyring, entries []policylog.Entry, s *policylog.State) []policylog.Outcome {
		if s == nil {
			s = policylog.NewState(true)
			s.Authenticate(keys)
		}
		var out []policylog.Outcome
		for _, e := range entries {
			out = append(out, s.Apply(e))
		}
		return out
	}

	retired := keyring(t, old.KeyringLine("ops-2025")+" until=2", cur.KeyringLine("ops-2026"))
	got := read(retired, log, nil)
	for i, want := range []string{policylog.Applied, policylog.Applied, policylog.Applied, policylog.Refused} {
		if got[i].Result != want {
			t.Fatalf("retired until=2, record %d: %s %q, want %s", i, got[i].Result, got[i].Reason, want)
		}
	}
	if got[3].Code != policylog.CodeUnauthenticated || !strings.Contains(got[3].Reason, "retired after revision 2") {
		t.Fatalf("a record past retirement: %s %q", got[3].Code, got[3].Reason)
	}
	if got[1].Record.Author != "ops-2025/ops" || got[2].Record.Author != "ops-2026/ops" {
		t.Fatalf("authors %q, %q", got[1].Record.Author, got[2].Record.Author)
	}

	// Removed: a reader that read the records before keeps them; one that
	// starts after refuses them.
	both := keyring(t, old.KeyringLine("ops-2025"), cur.KeyringLine("ops-2026"))
	early := policylog.NewState(true)
	early.Authenticate(both)
	read(nil, log[:3], early)
	if early.Head() != 3 || early.Overrides() != 2 {
		t.Fatalf("before removal: head %d, %d overrides", early.Head(), early.Overrides())
	}
	removed := keyring(t, cur.KeyringLine("ops-2026"))
	got = read(removed, log[:3], nil)
	if got[0].Code != policylog.CodeUnauthenticated || got[1].Code != policylog.CodeUnauthenticated || got[2].Code != policylog.CodeConflict {
		t.Fatalf("a reader starting after the removal: %s, %s, %s; want unauthenticated, unauthenticated, conflict", got[0].Code, got[1].Code, got[2].Code)
	}
	if early.Head() != 3 || early.Overrides() != 2 {
		t.Fatal("the early reader's state changed")
	}
}

// TestKeyringLines: what a keyring line may hold.
func TestKeyringLines(t *testing.T) {
	s := newSigner(t)
	line := s.KeyringLine("alice")
	for _, bad := range []string{
		"alice",
		line + " until=0",
		line + " since=3",
		"al ice " + strings.Fields(line)[1],
		"alice bm90IGEga2V5",
		"-x " + strings.Fields(line)[1],
		line + "\n" + s.KeyringLine("bob"),
	} {
		if _, err := policylog.ParseKeyring(strings.NewReader(bad)); err == nil {
			t.Errorf("keyring %q: accepted", bad)
		}
	}
	k := keyring(t, line+" until=7")
	if id, ok := k.Identity(s.Public()); !ok || id != "alice" || k.Len() != 1 {
		t.Fatalf("identity %q %v", id, ok)
	}
	p, err := policylog.ParseSigner(s.PEM())
	if err != nil || p.KeyID() != s.KeyID() {
		t.Fatalf("PEM round trip: %v", err)
	}
	if _, err := policylog.ParseSigner([]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")); err == nil {
		t.Fatal("a public key taken as a signing key")
	}
}

// TestClientRemembersChecks: a client that reads with the checks of an
// earlier one reaches the same state and remembers the same checks; a
// record altered in place since (a log that started over) is refused.
func TestClientRemembersChecks(t *testing.T) {
	s := newSigner(t)
	keys := keyring(t, s.KeyringLine("alice"))
	l := newMemLog()
	ctx := context.Background()
	w := policylog.NewClient(l, false)
	policylog.Keys{Signer: s, Ring: keys}.Use(w)
	if _, err := w.Push(ctx, docA, "", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for i := range 150 {
		if _, err := w.SetOverride(ctx, fmt.Sprintf("acct_%d", i), "", pro(), "", "", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	first := policylog.NewClient(l, false)
	first.Authenticate(keys)
	if err := first.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if first.Checked().Len() != 151 || first.State().Overrides() != 150 {
		t.Fatalf("%d checks, %d overrides", first.Checked().Len(), first.State().Overrides())
	}
	prior := first.Checked()

	// The record at offset 9 replaced by an unsigned one.
	forged := ovr(10, 9, "acct_8", "", &policy.Override{Tier: "free", Reason: "r"})
	b, _ := forged.Encode()
	l.mu.Lock()
	l.entries[9].Value = b
	l.mu.Unlock()
	second := policylog.NewClient(l, false)
	second.Authenticate(keys)
	second.UseChecked(prior)
	var refused []int64
	second.OnApply = func(e policylog.Entry, o policylog.Outcome) {
		if o.Result == policylog.Refused {
			refused = append(refused, e.Offset)
		}
	}
	if err := second.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// 9 is refused unauthenticated, and what follows it as conflicts.
	if len(refused) == 0 || refused[0] != 9 || second.Checked().Len() != 150 {
		t.Fatalf("refused %v, %d checks", refused, second.Checked().Len())
	}
}
