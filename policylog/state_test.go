package policylog_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

const docA = `version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
  pro:  { rate: 100, burst: 200 }
`

const docB = `version: 1
default_tier: free
tiers:
  free: { rate: 11, burst: 22 }
  pro:  { rate: 100, burst: 200 }
  gold: { rate: 1000, burst: 2000 }
`

// docNoPro drops the tier pro.
const docNoPro = `version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 20 }
`

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func doc(rev, parent int64, yaml, author string) policylog.Record {
	r := policylog.Record{Revision: rev, Parent: parent, Kind: policylog.KindPolicy, Author: author, Message: fmt.Sprintf("rev %d", rev), Time: t0, Document: yaml}
	r.Seal()
	return r
}

func ovr(rev, parent int64, key, scope string, o *policy.Override) policylog.Record {
	r := policylog.Record{Revision: rev, Parent: parent, Kind: policylog.KindOverride, Author: "ops", Message: "deal", Time: t0, Key: key, Scope: scope, Override: o}
	if o == nil {
		r.Deleted = true
	}
	r.Seal()
	return r
}

func entry(off int64, r policylog.Record) policylog.Entry {
	b, err := r.Encode()
	if err != nil {
		panic(err)
	}
	return policylog.Entry{Offset: off, Key: r.LogKey(), Value: b}
}

// TestApplyRule steps through the apply rule: what is applied, what is
// refused and why, and the head after each entry.
func TestApplyRule(t *testing.T) {
	garbled := entry(7, doc(3, 2, docA, "x"))
	garbled.Value = garbled.Value[:len(garbled.Value)/2]
	tampered := doc(3, 2, docB, "x")
	tampered.Document += "# changed after sealing\n"
	steps := []struct {
		e         policylog.Entry
		result    string
		code      string
		reason    string // substring
		head      int64
		overrides int
		freeRate  float64
		takenBy   string
	}{
		{e: entry(0, ovr(1, 0, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"})), result: policylog.Refused, code: policylog.CodeInvalid, reason: "no policy document yet"},
		{e: entry(1, doc(1, 0, docA, "alice")), result: policylog.Applied, head: 1, freeRate: 10},
		{e: entry(2, doc(1, 0, docB, "bob")), result: policylog.Refused, code: policylog.CodeConflict, reason: `by alice (policy: "rev 1")`, head: 1, freeRate: 10, takenBy: "alice"},
		{e: entry(3, doc(2, 1, "version: 1\ntiers: {}\n", "carol")), result: policylog.Refused, code: policylog.CodeInvalid, reason: "default_tier", head: 1, freeRate: 10},
		{e: entry(4, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "gold", Reason: "r"})), result: policylog.Refused, code: policylog.CodeInvalid, reason: `"gold" is not defined`, head: 1, freeRate: 10},
		{e: entry(5, ovr(2, 1, "acct_1", "", &policy.Override{Tier: "pro", Reason: "r"})), result: policylog.Applied, head: 2, overrides: 1, freeRate: 10},
		{e: entry(6, doc(3, 2, docNoPro, "dave")), result: policylog.Refused, code: policylog.CodeInvalid, reason: `override acct_1 names tier "pro"`, head: 2, overrides: 1, freeRate: 10},
		{e: garbled, result: policylog.Refused, code: policylog.CodeGarbled, head: 2, overrides: 1, freeRate: 10},
		{e: entry(8, tampered), result: policylog.Refused, code: policylog.CodeGarbled, reason: "does not match", head: 2, overrides: 1, freeRate: 10},
		{e: policylog.Entry{Offset: 9, Key: "policy", Value: []byte(`{"kind":"policy","revision":3,"parent":2,"sha256":"","bogus":1}`)}, result: policylog.Refused, code: policylog.CodeGarbled, head: 2, overrides: 1, freeRate: 10},
		{e: entry(10, doc(5, 4, docB, "eve")), result: policylog.Refused, code: policylog.CodeConflict, reason: "ahead of the head", head: 2, overrides: 1, freeRate: 10},
		{e: entry(11, doc(4, 2, docB, "eve")), result: policylog.Refused, code: policylog.CodeGarbled, reason: "does not follow", head: 2, overrides: 1, freeRate: 10},
		{e: policylog.Entry{Offset: 12, Key: "override/acct_9"}, result: policylog.Ignored, head: 2, overrides: 1, freeRate: 10}, // a tombstone
		{e: entry(13, doc(3, 2, docB, "frank")), result: policylog.Applied, head: 3, overrides: 1, freeRate: 11},
		{e: entry(14, ovr(4, 3, "acct_1", "x", &policy.Override{Rate: 1, Burst: 1, Reason: "r"})), result: policylog.Applied, head: 4, overrides: 2, freeRate: 11},
		{e: entry(15, ovr(5, 4, "acct_1", "", nil)), result: policylog.Applied, head: 5, overrides: 1, freeRate: 11},
		{e: entry(16, ovr(6, 5, "acct_1", "", nil)), result: policylog.Refused, code: policylog.CodeInvalid, reason: "no override of override acct_1", head: 5, overrides: 1, freeRate: 11},
		// A store routes the whole key (its quota and leases span its scopes);
		// whether a limiter has the store is not the log's question.
		{e: entry(17, ovr(6, 5, "acct_2", "x", &policy.Override{Store: "acme", Reason: "r"})), result: policylog.Refused, code: policylog.CodeInvalid, reason: "routes the whole key", head: 5, overrides: 1, freeRate: 11},
		{e: entry(18, ovr(6, 5, "acct_2", "", &policy.Override{Store: "acme", Reason: "r"})), result: policylog.Applied, head: 6, overrides: 2, freeRate: 11},
	}
	s := policylog.NewState(true)
	for i, st := range steps {
		o := s.Apply(st.e)
		if o.Result != st.result || o.Code != st.code || !strings.Contains(o.Reason, st.reason) || o.Head != st.head || s.Head() != st.head {
			t.Fatalf("step %d: got %s %s %q head %d; want %s %s %q head %d", i, o.Result, o.Code, o.Reason, o.Head, st.result, st.code, st.reason, st.head)
		}
		if o.Taken.Author != st.takenBy {
			t.Errorf("step %d: taken by %q, want %q", i, o.Taken.Author, st.takenBy)
		}
		if s.Overrides() != st.overrides {
			t.Errorf("step %d: %d overrides, want %d", i, s.Overrides(), st.overrides)
		}
		if st.freeRate != 0 {
			snap := s.Snapshot(nil)
			res, err := snap.Resolve("nobody", "x", "")
			if err != nil || res.Rate != st.freeRate {
				t.Errorf("step %d: free rate %v (%v), want %v", i, res.Rate, err, st.freeRate)
			}
		}
	}
	snap := s.Snapshot(nil)
	if res, _ := snap.Resolve("acct_1", "x", ""); res.Policy != "override:acct_1" || res.Burst != 1 {
		t.Errorf("the scoped override: %+v", res)
	}
}

// history is a log with refusals, conflicts, overrides replaced and deleted.
func history() []policylog.Record {
	pro := &policy.Override{Tier: "pro", Reason: "upgrade"}
	return []policylog.Record{
		doc(1, 0, docA, "alice"),
		ovr(2, 1, "acct_1", "", pro),
		ovr(3, 2, "acct_2", "", &policy.Override{Rate: 5, Burst: 9, Reason: "deal"}),
		doc(3, 2, docB, "racer"),                                     // lost the race for 3
		restated(doc(1, 0, docA, "alice"), doc(3, 2, docB, "racer")), // and restated the document in force, as Writer does
		doc(4, 3, docB, "bob"),
		ovr(5, 4, "acct_3", "s", &policy.Override{Tier: "gold", Reason: "trial"}),
		ovr(6, 5, "acct_2", "", &policy.Override{Rate: 6, Burst: 9, Reason: "deal 2"}),
		ovr(7, 6, "acct_1", "", nil),
		doc(8, 7, docA, "carol"), // drops gold, which acct_3 uses: refused
		doc(8, 7, docB+"# same tiers\n", "carol"),
		ovr(9, 8, "acct_4", "", pro),
		ovr(9, 8, "acct_5", "", pro), // lost the race for 9
		restated(absent("acct_5"), ovr(9, 8, "acct_5", "", pro)),
	}
}

// restated is r restated after refused was refused.
func restated(r, refused policylog.Record) policylog.Record {
	r.Restates = true
	r.RefusedRevision, r.RefusedSHA256 = refused.Revision, refused.SHA256
	return r
}

// absent is the restatement of a key without an override.
func absent(key string) policylog.Record {
	r := policylog.Record{Kind: policylog.KindOverride, Key: key, Deleted: true}
	r.Seal()
	return r
}

type view struct {
	Head      int64
	Doc       string
	Overrides []string
}

func viewOf(s *policylog.State) view {
	_, d := s.Document()
	v := view{Head: s.Head(), Doc: d.SHA256}
	for _, r := range s.OverrideRecords() {
		v.Overrides = append(v.Overrides, fmt.Sprintf("%s/%s@%d:%s", r.Key, r.Scope, r.Revision, r.SHA256[:8]))
	}
	return v
}

// TestCompactedReplaysToSameState applies the full log, then the same log
// as compaction leaves it (the latest record of each log key, offsets
// kept), then the State's own Records (the cache file): all three reach
// the same head, document and overrides.
func TestCompactedReplaysToSameState(t *testing.T) {
	recs := history()
	full := policylog.NewState(true)
	var entries []policylog.Entry
	for i, r := range recs {
		e := entry(int64(i), r)
		entries = append(entries, e)
		full.Apply(e)
	}
	if o := full.Apply(entry(99, restated(doc(1, 0, docA, "alice"), doc(3, 2, docB, "racer")))); o.Result != policylog.Ignored {
		t.Fatalf("a restatement on the full log: %s %s", o.Result, o.Reason)
	}
	want := viewOf(full)
	if want.Head != 9 || len(want.Overrides) != 3 {
		t.Fatalf("full log: %+v", want)
	}

	last := map[string]int{}
	for i, e := range entries {
		last[e.Key] = i
	}
	compacted := policylog.NewState(true)
	kept := 0
	for i, e := range entries {
		if last[e.Key] == i {
			compacted.Apply(e)
			kept++
		}
	}
	if kept >= len(entries) {
		t.Fatal("compaction removed nothing")
	}
	if got := viewOf(compacted); !reflect.DeepEqual(got, want) {
		t.Errorf("compacted log:\n got %+v\nwant %+v", got, want)
	}

	// Compaction leaves the head of the log (the active segment) as it is:
	// every prefix compacted, the rest whole, replays to the same state.
	for j := range entries {
		partial := policylog.NewState(true)
		for i, e := range entries {
			if i >= j || last[e.Key] == i {
				partial.Apply(e)
			}
		}
		if got := viewOf(partial); !reflect.DeepEqual(got, want) {
			t.Errorf("compacted before offset %d:\n got %+v\nwant %+v", j, got, want)
		}
	}

	cached := policylog.NewState(true)
	for i, r := range full.Records() {
		if o := cached.Apply(entry(int64(2*i+1), r)); o.Result != policylog.Applied {
			t.Fatalf("cache record %d: %s %s", i, o.Result, o.Reason)
		}
	}
	if got := viewOf(cached); !reflect.DeepEqual(got, want) {
		t.Errorf("from Records:\n got %+v\nwant %+v", got, want)
	}
	// Resolution agrees too.
	for _, k := range []string{"acct_1", "acct_2", "acct_3", "acct_4", "other"} {
		a, _ := full.Snapshot(nil).Resolve(k, "s", "")
		b, _ := compacted.Snapshot(nil).Resolve(k, "s", "")
		if a != b {
			t.Errorf("%s: full %+v, compacted %+v", k, a, b)
		}
	}
}
