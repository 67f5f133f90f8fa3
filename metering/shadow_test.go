package metering

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The shadow verdict rides in version 1: absent when no shadow limit was
// evaluated (old bytes unchanged), and ignored by a decoder that predates it.
func TestShadowVerdictIsBackwardCompatible(t *testing.T) {
	plain := sample()
	before := plain.AppendEncode(nil)
	if bytes.Contains(before, []byte("shadow")) {
		t.Fatalf("an event without a shadow verdict mentions it: %s", before)
	}
	for _, rejected := range []bool{false, true} {
		e := sample()
		e.Shadow, e.ShadowRejected, e.ShadowRevision = "search-trial", rejected, 7
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got := e.AppendEncode(nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
		}
		var dec Decoder
		fast, err := dec.Decode(got)
		if err != nil || fast != e {
			t.Fatalf("Decoder: %+v %v, want %+v", fast, err, e)
		}
		slow, err := Decode(got)
		if err != nil || slow != e {
			t.Fatalf("Decode: %+v %v, want %+v", slow, err, e)
		}
		// A consumer built before the shadow fields existed.
		var old struct {
			V       int    `json:"v"`
			Key     string `json:"key"`
			Allowed bool   `json:"allowed"`
		}
		if err := json.Unmarshal(got, &old); err != nil || old.V != 1 || old.Key != e.Key || !old.Allowed {
			t.Fatalf("an older decoder: %+v %v", old, err)
		}
	}
}
