package policylog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// TestCacheJSONIsJSONMarshal: the cache encoded in parts, on every CPU,
// is byte for byte json.Marshal of the whole body, with no overrides, a
// few, and enough to be encoded in parts.
func TestCacheJSONIsJSONMarshal(t *testing.T) {
	for _, n := range []int{0, 3, 3 * walkParallel} {
		st := NewState(false)
		doc := Record{Revision: 1, Kind: KindPolicy, Author: "a", Document: "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n  pro: { rate: 100, burst: 200 }\n"}
		doc.Seal()
		v, _ := doc.Encode()
		st.Apply(Entry{Offset: 0, Key: DocumentKey, Value: v})
		for i := range n {
			o := &policy.Override{Tier: "pro", Reason: "r<&>"}
			switch i % 6 {
			case 1:
				o = &policy.Override{Rate: 5, Burst: 7, Reason: "r"}
			case 2:
				o = &policy.Override{Rate: float64(i), Burst: 7, Period: "minute", Quota: int64(i + 1), QuotaPeriod: "month", Scope: "regional", Reason: "r"}
			case 3:
				o = &policy.Override{Tier: "free", Expires: time.Date(2027, 2, 3, 4, 5, 6, i, time.UTC), Reason: "r"}
			case 4:
				o = &policy.Override{Rate: 1, Burst: 1, Period: "day", Store: "dedicated", Reason: "r"}
			}
			key := fmt.Sprintf("k%d", i)
			if i%10 == 0 {
				key = fmt.Sprintf("k<%d>", i)
			}
			r := Record{Revision: int64(i + 2), Parent: int64(i + 1), Kind: KindOverride, Key: key, Override: o}
			if i%6 == 5 {
				r.Scope = "api:search"
			}
			r.Seal()
			v, _ := r.Encode()
			if out := st.Apply(Entry{Offset: int64(i + 1), Key: r.LogKey(), Value: v}); out.Result != Applied {
				t.Fatal(out.Reason)
			}
		}
		_, d := st.Document()
		body := cacheBody{Topic: "t", Head: st.Head(), Epoch: st.Epoch(), Document: d, Overrides: make([]cachedOverride, 0, st.Overrides())}
		st.EachOverride(func(k policy.OverrideKey, o policy.Override) {
			o.Reason = "cached"
			body.Overrides = append(body.Overrides, cachedOverride{Key: k.Key, Scope: k.Scope, Override: o})
		})
		want, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		parts, err := cacheJSON(cacheBody{Topic: "t", Head: st.Head(), Epoch: st.Epoch(), Document: d}, st)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Join(parts, nil); !bytes.Equal(got, want) {
			t.Fatalf("%d overrides: cacheJSON differs from json.Marshal:\n%.300s\n%.300s", n, got, want)
		}
	}
}
