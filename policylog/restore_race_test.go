package policylog_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policylog"
)

// compacted is l as compaction leaves it: the latest record of each log
// key, at its offset.
func compacted(l *memLog) *memLog {
	last := map[string]int{}
	for i, e := range l.entries {
		last[e.Key] = i
	}
	m := newMemLog()
	for i, e := range l.entries {
		if last[e.Key] == i {
			m.entries = append(m.entries, e)
		}
	}
	return m
}

// TestConcurrentRestoresLeaveOneEpoch: two restores of a lost log at the
// same time, from two sources: the first applies; the second is refused, says who got in
// first, and restates the epoch in force, so that the full log and the
// log compaction leaves (where the latest record of log key "epoch" is
// the one kept) reach the same state, the one restored.
func TestConcurrentRestoresLeaveOneEpoch(t *testing.T) {
	ctx := context.Background()
	old := newMemLog()
	w := policylog.NewClient(old, true)
	if _, err := w.Push(ctx, followDoc, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := w.SetOverride(ctx, fmt.Sprintf("acct_%d", i), "", pro(), "alice", "deal", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	from := w.State()
	// Carol restores from another source, one override more.
	more := policylog.NewClient(old, true)
	if _, err := more.SetOverride(ctx, "acct_9", "", pro(), "alice", "deal", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	fromCarol := more.State()

	l := newMemLog()
	rl := &racingLog{memLog: l}
	rl.before = func() {
		if _, err := policylog.NewClient(l, true).Restore(ctx, from, "bob", "bob's restore"); err != nil {
			t.Error(err)
		}
	}
	o, err := policylog.NewClient(rl, true).Restore(ctx, fromCarol, "carol", "carol's restore")
	var ref *policylog.Refusal
	if !errors.As(err, &ref) || o.Code != policylog.CodeConflict || !strings.Contains(o.Reason, "another restore got in first") || !strings.Contains(o.Reason, "bob") {
		t.Fatalf("the second restore: %+v, %v", o, err)
	}
	if n := len(l.entries); n != 3 {
		t.Fatalf("%d records, want bob's epoch, carol's refused one and its restatement", n)
	}
	for name, m := range map[string]*memLog{"full": l, "compacted": compacted(l)} {
		c := policylog.NewClient(m, false)
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if st := c.State(); st.Digest() != from.Digest() || st.Epoch() != 1 || st.Head() != from.Head() || st.Overrides() != 3 {
			t.Fatalf("%s log: epoch %d, head %d, %d overrides, digest %s; restored %s", name, st.Epoch(), st.Head(), st.Overrides(), st.Digest(), from.Digest())
		}
	}
}
