package billing

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
)

func TestCorrectionRequestKinds(t *testing.T) {
	from := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	odd := from.Add(30 * time.Second)
	n := func(v int64) *int64 { return &v }
	base := Request{ID: "c-1", Key: "acct", Reason: "why"}
	with := func(f func(r *Request)) Request { r := base; f(&r); return r }
	for _, tc := range []struct {
		name string
		req  Request
		want string // "" = refused
	}{
		{"void an event", with(func(r *Request) { r.EventID = "e1" }), KindVoidEvent},
		{"void a range", with(func(r *Request) { r.From, r.To = &from, &to }), KindVoidRange},
		{"void one scope's range", with(func(r *Request) { r.From, r.To, r.Scope = &from, &to, "api" }), KindVoidRange},
		{"credit", with(func(r *Request) { r.Cost = n(-5) }), KindCredit},
		{"credit of requests and cost", with(func(r *Request) { r.Cost, r.Requests = n(-5), n(-2) }), KindCredit},
		{"debit at a time", with(func(r *Request) { r.Requests, r.From = n(3), &from }), KindDebit},
		{"mixed signs", with(func(r *Request) { r.Cost, r.Requests = n(-5), n(2) }), ""},
		{"zero", with(func(r *Request) { r.Cost = n(0) }), ""},
		{"nothing to correct", base, ""},
		{"event and range", with(func(r *Request) { r.EventID, r.From, r.To = "e1", &from, &to }), ""},
		{"range backwards", with(func(r *Request) { r.From, r.To = &to, &from }), ""},
		{"range not whole minutes", with(func(r *Request) { r.From, r.To = &odd, &to }), ""},
		{"range too long", with(func(r *Request) { t2 := from.Add(MaxVoidRange + time.Minute); r.From, r.To = &from, &t2 }), ""},
		{"credit with to", with(func(r *Request) { r.Cost, r.To = n(-1), &to }), ""},
		{"no reason", with(func(r *Request) { r.EventID, r.Reason = "e1", "  " }), ""},
		{"bad id", with(func(r *Request) { r.EventID, r.ID = "e1", "a b" }), ""},
		{"no key", with(func(r *Request) { r.EventID, r.Key = "e1", "" }), ""},
	} {
		got, err := tc.req.kind()
		if tc.want == "" {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %q, %v; want ErrInvalid", tc.name, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %s", tc.name, got, err, tc.want)
		}
	}
}

// TestCorrectionEventsAreTheSameEveryTime: a correction published again
// must be the very same events (ids and times), or the consumer's
// deduplication would count it twice; a void piece subtracts in the
// rollups' terms (requests, rejected, cost as actual − estimate).
func TestCorrectionEventsAreTheSameEveryTime(t *testing.T) {
	c := Correction{ID: "v-1", Key: "acct", Kind: KindVoidRange, Operator: "alice",
		Pieces: []Piece{{TS: 1772445600000, Scope: "api", Requests: -3, Rejected: -1, Cost: -7}, {TS: 1772445660000, Scope: "llm", Cost: 4}}}
	a, b := Events(c), Events(c)
	if !reflect.DeepEqual(a, b) || a[0].EventID == a[1].EventID {
		t.Fatalf("events differ or share an id: %+v", a)
	}
	e := a[0]
	if e.Kind != metering.KindCorrection || e.Tier != "correction:v-1" || e.Requests != -3 || e.Rejected != -1 ||
		int64(e.Actual)-int64(e.Estimate) != -7 || e.TS != 1772445600000 || e.IsDecision() {
		t.Fatalf("void piece's event %+v", e)
	}
	if got := int64(a[1].Actual) - int64(a[1].Estimate); got != 4 {
		t.Fatalf("debit piece's cost %d", got)
	}
	enc, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := metering.Decode(enc)
	if err != nil || back != e {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if id, ok := CorrectionOf(e.Tier); !ok || id != "v-1" {
		t.Fatalf("CorrectionOf(%q) = %q %t", e.Tier, id, ok)
	}
}
