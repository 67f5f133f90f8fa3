package metering

import (
	"bytes"
	"testing"
)

func sample() Event {
	return Event{EventID: "01JDXYZ", TS: 1764410000123, Key: "acct_8812", Scope: "api:search", Tier: "pro",
		Cost: 10, Allowed: true, Source: "shared", Remaining: 42, Limit: 100, Policy: "pro-search",
		DryRun: false, Warning: true, Instance: "lim-1"}
}

func TestAppendEncodeMatchesEncode(t *testing.T) {
	cases := []Event{sample(), {}, {Key: `a"b\c<d>&e`, Scope: "é\u2028\x01", Remaining: -5, Limit: -1, TS: -3}}
	for _, e := range cases {
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if got := e.AppendEncode(nil); !bytes.Equal(got, want) {
			t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
		}
	}
}

func FuzzAppendEncode(f *testing.F) {
	f.Add("k", "s", "\xff\x00<", int64(3), uint64(7))
	f.Fuzz(func(t *testing.T, key, scope, policy string, ts int64, cost uint64) {
		e := sample()
		e.Key, e.Scope, e.Policy, e.TS, e.Cost = key, scope, policy, ts, cost
		want, _ := e.Encode()
		if got := e.AppendEncode(nil); !bytes.Equal(got, want) {
			t.Fatalf("got %s want %s", got, want)
		}
	})
}

func TestAppendEncodeRoundTrips(t *testing.T) {
	e := sample()
	got, err := Decode(e.AppendEncode(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got != e {
		t.Fatalf("round trip: got %+v want %+v", got, e)
	}
}

func BenchmarkAppendEncode(b *testing.B) {
	e := sample()
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = e.AppendEncode(buf[:0])
	}
}

func BenchmarkEncode(b *testing.B) {
	e := sample()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = e.Encode()
	}
}

func BenchmarkDecode(b *testing.B) {
	e := sample()
	buf := e.AppendEncode(nil)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = Decode(buf)
	}
}

func FuzzDecoderMatchesDecode(f *testing.F) {
	e := sample()
	f.Add(e.AppendEncode(nil))
	e.Region = "b"
	f.Add(e.AppendEncode(nil))
	f.Add([]byte(`{"v":1,"event_id":"a","ts":5,"key":"k","scope":"s","extra":[1]}`))
	f.Add([]byte(`{"v":2,"event_id":"a","ts":5,"key":"k","scope":"s"}`))
	f.Add([]byte(` {"ts":5 , "v":1,"event_id":"a","key":"k\"","scope":"s","cost":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Decoder
		got, gotErr := d.Decode(b)
		want, wantErr := Decode(b)
		if (gotErr == nil) != (wantErr == nil) || got != want {
			t.Fatalf("Decoder: %+v, %v; Decode: %+v, %v", got, gotErr, want, wantErr)
		}
	})
}

// BenchmarkDecoder decodes a string, as the consumer does.
func BenchmarkDecoder(b *testing.B) {
	e := sample()
	s := string(e.AppendEncode(nil))
	var d Decoder
	b.ReportAllocs()
	for b.Loop() {
		_, _ = d.DecodeString(s)
	}
}
