package metering

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The region rides in version 1: absent in a one-region deployment (the
// bytes of such an event are unchanged), the same through every encoder and
// decoder, and ignored by a decoder that predates it.
func TestRegionIsBackwardCompatible(t *testing.T) {
	plain := sample()
	if b := plain.AppendEncode(nil); bytes.Contains(b, []byte("region")) {
		t.Fatalf("a one-region event mentions a region: %s", b)
	}
	settle := sample()
	settle.Kind, settle.Reservation, settle.Cost, settle.Estimate, settle.Actual, settle.ReservedTS = KindSettle, "AQID", 0, 3, 7, settle.TS-10
	traced := sample()
	traced.TraceID, traced.Shadow = "4bf92f3577b34da6a3ce929d0e0e4736", "trial"
	for _, e := range []Event{sample(), settle, traced} {
		e.Region = "eu-west-1"
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got := e.AppendEncode(nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
		}
		if !bytes.HasSuffix(got, []byte(`,"region":"eu-west-1"}`)) {
			t.Fatalf("region is not the last member: %s", got)
		}
		var dec Decoder
		if fast, ok := dec.scanOK(got); !ok || fast != e {
			t.Fatalf("the fast path refused or changed %s: %+v %v", got, fast, ok)
		}
		if slow, err := Decode(got); err != nil || slow != e {
			t.Fatalf("Decode: %+v %v, want %+v", slow, err, e)
		}
		// encoding/json is the reference every fast path must agree with.
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
}

// A region written twice, or as a non-string, is left to encoding/json, and
// the fast decoder gives the same answer as Decode.
func TestRegionOddInputsAgreeWithDecode(t *testing.T) {
	base := `{"v":1,"event_id":"a","ts":5,"key":"k","scope":"s"`
	for _, in := range []string{
		base + `,"region":"b"}`,
		base + `,"region":"b","region":"c"}`,
		base + `,"region":7}`,
		base + `,"region":"\u0062"}`,
		base + `,"region":""}`,
		base + `,"region":null}`,
	} {
		var d Decoder
		got, gotErr := d.Decode([]byte(in))
		want, wantErr := Decode([]byte(in))
		if (gotErr == nil) != (wantErr == nil) || got != want {
			t.Fatalf("%s: Decoder %+v, %v; Decode %+v, %v", in, got, gotErr, want, wantErr)
		}
	}
}

func FuzzRegionEncodeDecode(f *testing.F) {
	f.Add("a")
	f.Add("")
	f.Add("é\"\\\x00")
	f.Fuzz(func(t *testing.T, region string) {
		e := sample()
		e.Region = region
		want, _ := e.Encode()
		got := e.AppendEncode(nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendEncode %s, Encode %s", got, want)
		}
		var d Decoder
		fast, err1 := d.Decode(got)
		slow, err2 := Decode(got)
		if err1 != nil || err2 != nil || fast != slow {
			t.Fatalf("Decoder %+v %v; Decode %+v %v", fast, err1, slow, err2)
		}
	})
}
