package metering

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The trace id rides in version 1: absent when the decision was not traced
// (the bytes of an untraced event are unchanged), the same through every
// encoder and decoder, and ignored by a decoder that predates it.
func TestTraceIDIsBackwardCompatible(t *testing.T) {
	plain := sample()
	if b := plain.AppendEncode(nil); bytes.Contains(b, []byte("trace_id")) {
		t.Fatalf("an untraced event mentions a trace: %s", b)
	}
	e := sample()
	e.Shadow = "trial"
	e.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got := e.AppendEncode(nil)
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
	}
	if !bytes.HasSuffix(got, []byte(`,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}`)) {
		t.Fatalf("trace_id is not the last member: %s", got)
	}
	var dec Decoder
	if fast, ok := dec.scanOK(got); !ok || fast != e {
		t.Fatalf("the fast path refused or changed it: %+v %v", fast, ok)
	}
	slow, err := Decode(got)
	if err != nil || slow != e {
		t.Fatalf("Decode: %+v %v, want %+v", slow, err, e)
	}
	var old struct {
		V   int    `json:"v"`
		Key string `json:"key"`
	}
	if err := json.Unmarshal(got, &old); err != nil || old.V != 1 || old.Key != e.Key {
		t.Fatalf("an older decoder: %+v %v", old, err)
	}
}

// scanOK is the Decoder's fast path alone, for tests that must know it
// was taken.
func (d *Decoder) scanOK(b []byte) (Event, bool) {
	e, _, ok := d.scan(string(b))
	return e, ok
}
