package metering

import (
	"bytes"
	"encoding/json"
	"testing"
)

// A slot decision's members ride in version 1: absent from every other
// event (whose bytes are unchanged), the same through every encoder and
// decoder, and ignored by a decoder that predates them.
func TestSlotMembersAreBackwardCompatible(t *testing.T) {
	plain := sample()
	if b := plain.AppendEncode(nil); bytes.Contains(b, []byte("slot")) || bytes.Contains(b, []byte("in_flight")) {
		t.Fatalf("an event without a slot mentions one: %s", b)
	}
	alone := sample() // a concurrency alone: the slot decision is the request
	alone.Slot, alone.Priority, alone.InFlight = SlotTaken, "default", 7
	shed := sample() // beside a rate: the rate's decision counted the request
	shed.Kind, shed.Cost, shed.Allowed, shed.Slot, shed.Priority, shed.InFlight, shed.Region = KindSlot, 0, false, SlotShed, "sheddable", 10, "eu"
	released := sample()
	released.Kind, released.Cost, released.Slot, released.Priority = KindSlot, 0, SlotReleased, ""
	for _, e := range []Event{alone, shed, released} {
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
		var ref Event
		if err := json.Unmarshal(got, &ref); err != nil || ref != e {
			t.Fatalf("encoding/json: %+v %v, want %+v", ref, err, e)
		}
		var old struct {
			V   int    `json:"v"`
			Key string `json:"key"`
		}
		if err := json.Unmarshal(got, &old); err != nil || old.V != 1 || old.Key != e.Key {
			t.Fatalf("an older decoder: %+v %v", old, err)
		}
	}
	if alone.IsDecision() != true || shed.IsDecision() || released.IsDecision() {
		t.Fatal("a slot event beside a rate, or a release, counts as a request; a concurrency alone's does not")
	}
}
