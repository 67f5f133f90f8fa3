package policylog_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

// forgedValue is rec's value carrying the signature s made for another
// record: signed in form by a trusted key, but not by it.
func forgedValue(t *testing.T, s *policylog.Signer, rec policylog.Record) []byte {
	t.Helper()
	other := rec
	other.Message = "the record that was signed"
	good, err := s.Encode(&other)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(string(good), `,"sig":"`)
	plain, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return append(append([]byte(nil), plain[:len(plain)-1]...), good[i:]...)
}

// readBoth reads l once through its checkpoint (fetches of 40 entries)
// and once with every signature checked (the whole log in one fetch: no
// checkpoint is looked for), and returns what each made of it.
type readResult struct {
	st      *policylog.State
	refused []string // offset: code: reason
	cp      []policylog.CheckpointResult
}

func readLog(t *testing.T, l *memLog, ring *policylog.Keyring, batch int) readResult {
	t.Helper()
	l.mu.Lock()
	l.batch = batch
	l.mu.Unlock()
	var r readResult
	c := policylog.NewClient(l, false)
	c.Authenticate(ring)
	c.OnApply = func(e policylog.Entry, o policylog.Outcome) {
		if o.Result == policylog.Refused {
			r.refused = append(r.refused, fmt.Sprintf("%d: %s: %s", e.Offset, o.Code, o.Reason))
		}
	}
	c.OnCheckpoint = func(res policylog.CheckpointResult) { r.cp = append(r.cp, res) }
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.st = c.State()
	return r
}

func sameRead(t *testing.T, a, b readResult) {
	t.Helper()
	if a.st.Head() != b.st.Head() || a.st.Overrides() != b.st.Overrides() || a.st.CheckpointDigest() != b.st.CheckpointDigest() || a.st.Digest() != b.st.Digest() {
		t.Fatalf("through the checkpoint: head %d, %d overrides, digest %s; every signature checked: head %d, %d overrides, digest %s",
			a.st.Head(), a.st.Overrides(), a.st.Digest(), b.st.Head(), b.st.Overrides(), b.st.Digest())
	}
	if fmt.Sprint(a.refused) != fmt.Sprint(b.refused) {
		t.Fatalf("refusals differ:\n through the checkpoint %q\n every signature checked %q", a.refused, b.refused)
	}
}

// TestCheckpointVouchesForWhatItsWriterChecked: a reader that starts on
// a log with a checkpoint applies the records below it without checking
// their signatures, refuses the forged record the checkpoint lists with
// the reason a check gives, checks what follows, and reaches the state
// (and the refusals) of a reader that checks every signature. A writer
// writes a checkpoint every CheckpointEvery records by itself.
func TestCheckpointVouchesForWhatItsWriterChecked(t *testing.T) {
	ctx := context.Background()
	s := newSigner(t)
	ring := keyring(t, s.KeyringLine("ops"))
	l := newMemLog()
	w := policylog.NewClient(l, true)
	policylog.Keys{Signer: s, Ring: ring}.Use(w)
	w.CheckpointEvery = 100
	if _, err := w.Push(ctx, followDoc, "", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for i := range 150 {
		if _, err := w.SetOverride(ctx, fmt.Sprintf("acct_%d", i), "", pro(), "", "deal", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
		if i == 60 {
			// A forged record at the head, as someone with Kafka access
			// and no key would write it: refused everywhere.
			rec := policylog.Record{Revision: w.State().Head() + 1, Parent: w.State().Head(), Kind: policylog.KindOverride,
				Key: "acct_0", Override: &policy.Override{Rate: 1e6, Burst: 1e6, Reason: "free for me"}}
			rec.Seal()
			if _, err := l.Append(ctx, rec.LogKey(), forgedValue(t, s, rec)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if w.CheckpointErr != nil {
		t.Fatal(w.CheckpointErr)
	}
	o, err := w.Checkpoint(ctx, "", "by hand")
	if err != nil || o.Result != policylog.Ignored {
		t.Fatalf("checkpoint: %+v, %v", o, err)
	}
	for i := range 5 {
		if _, err := w.SetOverride(ctx, fmt.Sprintf("late_%d", i), "", pro(), "", "after", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	checkpoints := 0
	for _, e := range l.entries {
		if e.Key == policylog.CheckpointKey {
			checkpoints++
		}
	}
	if checkpoints != 2 { // one written by the 100th record, one by hand
		t.Fatalf("%d checkpoints in the log, want 2", checkpoints)
	}

	fast, full := readLog(t, l, ring, 40), readLog(t, l, ring, 0)
	sameRead(t, fast, full)
	if len(fast.cp) != 1 || !fast.cp[0].Matched || fast.cp[0].Vouched < 150 || len(full.cp) != 0 {
		t.Fatalf("checkpoints relied on: %+v (every signature checked: %+v)", fast.cp, full.cp)
	}
	if len(full.refused) != 1 || !strings.Contains(full.refused[0], "unauthenticated: ") || !strings.Contains(full.refused[0], "does not match") {
		t.Fatalf("refused %q, want the forged record", full.refused)
	}
	if fast.st.Head() != w.State().Head() || fast.st.CheckpointDigest() != w.State().CheckpointDigest() {
		t.Fatal("the reader does not reach the writer's state")
	}
}

// TestCheckpointThatDoesNotMatchIsNotTrusted: a record below the
// checkpoint whose signature does not hold and that the checkpoint does
// not list (a forgery put in place of a genuine one, or a checkpoint
// copied into another log) changes the state, so the digests differ: the
// reader says so, reads the log again with every signature checked, and
// reaches what a reader that checks everything reaches.
func TestCheckpointThatDoesNotMatchIsNotTrusted(t *testing.T) {
	ctx := context.Background()
	s := newSigner(t)
	ring := keyring(t, s.KeyringLine("ops"))
	l := newMemLog()
	w := policylog.NewClient(l, true)
	policylog.Keys{Signer: s, Ring: ring}.Use(w)
	w.CheckpointEvery = 0
	if _, err := w.Push(ctx, followDoc, "", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for i := range 120 {
		if _, err := w.SetOverride(ctx, fmt.Sprintf("acct_%d", i), "", pro(), "", "deal", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Checkpoint(ctx, "", "by hand"); err != nil {
		t.Fatal(err)
	}
	cpEntry := l.entries[len(l.entries)-1]

	for name, build := range map[string]func() *memLog{
		// Offset 50's record replaced by a forgery with a raised limit.
		"forgery in place": func() *memLog {
			m := newMemLog()
			m.entries = append(m.entries, l.entries...)
			rec, err := policylog.Decode(m.entries[50].Key, m.entries[50].Value)
			if err != nil {
				t.Fatal(err)
			}
			rec.Sig = ""
			rec.Override = &policy.Override{Rate: 1e6, Burst: 1e6, Reason: "free for me"}
			rec.Seal()
			m.entries[50].Value = forgedValue(t, s, rec)
			return m
		},
		// A new log of forged records, padded to the checkpoint's offset,
		// then the checkpoint copied in.
		"checkpoint copied into another log": func() *memLog {
			m := newMemLog()
			m.entries = append(m.entries, l.entries[0]) // the genuine document
			for i := int64(1); i < cpEntry.Offset; i++ {
				rec := policylog.Record{Revision: i + 1, Parent: i, Kind: policylog.KindOverride, Key: fmt.Sprintf("mine_%d", i),
					Override: &policy.Override{Rate: 1e6, Burst: 1e6, Reason: "free for me"}}
				rec.Seal()
				m.entries = append(m.entries, policylog.Entry{Offset: i, Key: rec.LogKey(), Value: forgedValue(t, s, rec)})
			}
			cp := cpEntry
			cp.Offset = int64(len(m.entries))
			m.entries = append(m.entries, cp)
			return m
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := build()
			fast, full := readLog(t, m, ring, 40), readLog(t, m, ring, 0)
			sameRead(t, fast, full)
			if len(fast.cp) != 1 || fast.cp[0].Matched || fast.cp[0].Reason == "" {
				t.Fatalf("checkpoint relied on: %+v, want a mismatch", fast.cp)
			}
			if len(full.refused) == 0 {
				t.Fatal("the forgery was not refused")
			}
		})
	}
}

// TestCheckpointNeedsAKeyTheKeyringTrusts: without a keyring or a key
// it trusts, a writer writes no checkpoint (it would vouch for checks it
// did not make), and a reader ignores a checkpoint its keyring does not
// trust.
func TestCheckpointNeedsAKeyTheKeyringTrusts(t *testing.T) {
	ctx := context.Background()
	s, other := newSigner(t), newSigner(t)
	l := newMemLog()
	w := policylog.NewClient(l, false)
	w.Sign(s)
	if _, err := w.Checkpoint(ctx, "", "x"); err == nil {
		t.Fatal("a checkpoint without a keyring")
	}
	ring := keyring(t, s.KeyringLine("ops"), other.KeyringLine("other"))
	policylog.Keys{Signer: s, Ring: ring}.Use(w)
	if _, err := w.Push(ctx, followDoc, "", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := w.SetOverride(ctx, fmt.Sprintf("acct_%d", i), "", pro(), "", "deal", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Checkpoint(ctx, "", "x"); err != nil {
		t.Fatal(err)
	}
	// A reader that trusts only the other key refuses every record, and
	// does not rely on the checkpoint either.
	r := readLog(t, l, keyring(t, other.KeyringLine("other")), 40)
	if len(r.cp) != 0 || r.st.Head() != 0 {
		t.Fatalf("a reader of another keyring: checkpoints %+v, head %d", r.cp, r.st.Head())
	}
}
