package metering

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Kinds ride in version 1: a decision's bytes are unchanged, a settle and
// a charge round-trip through every encoder and decoder, an event without
// a kind is a decision, and a decoder that predates kinds still reads
// them.
func TestKindsAreBackwardCompatible(t *testing.T) {
	plain := sample()
	if b := plain.AppendEncode(nil); bytes.Contains(b, []byte("kind")) || !plain.IsDecision() {
		t.Fatalf("a plain decision changed: %s", b)
	}
	reserve := sample()
	reserve.Kind, reserve.Reservation = KindDecision, "AQID_-x"
	settle := sample()
	settle.Kind, settle.Reservation, settle.Cost, settle.Estimate, settle.Actual, settle.ReservedTS = KindSettle, "AQID_-x", 0, 300, 742, settle.TS-5000
	charge := sample()
	charge.Kind, charge.Cost, charge.Actual = KindCharge, 0, 55
	for _, e := range []Event{reserve, settle, charge} {
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got := e.AppendEncode(nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
		}
		var dec Decoder
		if fast, ok := dec.scanOK(got); !ok || fast != e {
			t.Fatalf("the fast path refused or changed %s: %+v %v", got, fast, ok)
		}
		if slow, err := Decode(got); err != nil || slow != e {
			t.Fatalf("Decode: %+v %v, want %+v", slow, err, e)
		}
		if e.IsDecision() != (e.Kind == KindDecision) {
			t.Fatalf("IsDecision of kind %q", e.Kind)
		}
		var old struct {
			V     int    `json:"v"`
			Key   string `json:"key"`
			Cost  uint64 `json:"cost"`
			Allow bool   `json:"allowed"`
		}
		if err := json.Unmarshal(got, &old); err != nil || old.V != 1 || old.Key != e.Key {
			t.Fatalf("an older decoder: %+v %v", old, err)
		}
	}
}
