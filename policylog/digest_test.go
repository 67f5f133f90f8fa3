package policylog_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

// TestDigestsAreStable pins State.Digest and State.CheckpointDigest of a
// state of 50,000 overrides of every shape (enough to be walked on every
// CPU): a checkpoint carries its digest to readers of other versions, and
// limiters compare their digests, so neither may change.
func TestDigestsAreStable(t *testing.T) {
	scopeOf := func(i int) string {
		if i%7 == 3 {
			return fmt.Sprintf("api:%d", i%3)
		}
		return ""
	}
	s := policylog.NewState(false)
	s.Apply(entry(0, doc(1, 0, docA, "alice")))
	var ops []policylog.Record
	for i := range 50_000 {
		o := &policy.Override{Tier: "pro", Reason: "deal"}
		switch i % 5 {
		case 1:
			o = &policy.Override{Rate: float64(i%97) + 0.5, Burst: int64(i%13 + 1), Period: "minute", Reason: "deal"}
		case 2:
			o = &policy.Override{Quota: int64(i + 1), QuotaPeriod: "day", Scope: "global", Reason: "deal"}
		case 3:
			o = &policy.Override{Tier: "free", Expires: time.Date(2027, 1, 1, 0, 0, 0, i, time.UTC), Reason: "deal"}
		}
		ops = append(ops, ovr(int64(len(ops)+2), int64(len(ops)+1), fmt.Sprintf("k%d", i%45_000), scopeOf(i), o))
		if j := i - 500; i%1000 == 999 {
			ops = append(ops, ovr(int64(len(ops)+2), int64(len(ops)+1), fmt.Sprintf("k%d", j%45_000), scopeOf(j), nil))
		}
	}
	for i, r := range ops {
		if out := s.Apply(entry(int64(i+1), r)); out.Result != policylog.Applied {
			t.Fatalf("record %d: %s %s", i, out.Result, out.Reason)
		}
	}
	if got, want := s.Overrides(), 0; got == want {
		t.Fatal("no overrides")
	}
	if got, want := s.Digest(), "49a0eeeaba3aff2c0efc04085f68345b"; got != want {
		t.Errorf("Digest %s, want %s", got, want)
	}
	if got, want := s.CheckpointDigest(), "a20d7c845cda7b0df6e027ede8b228708ee52fe98cbf110f65dd2bc6559661b3"; got != want {
		t.Errorf("CheckpointDigest %s, want %s", got, want)
	}
}
