package httpapi

import "testing"

// BenchmarkDecodeCheckBody compares the two decoders of a /check body on
// the body well-behaved clients send: scanCheck, the fast path, and
// decodeCheckJSON (encoding/json), which every other body takes. The
// figures are in BENCHMARKS.md, "Hand-written code against the library".
func BenchmarkDecodeCheckBody(b *testing.B) {
	body := []byte(`{"key":"acct_8812","scope":"api:search","cost":10,"tier":"pro"}`)
	b.Run("scanCheck", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := scanCheck(body); !ok {
				b.Fatal("not taken")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var cb checkBody
			if err := decodeCheckJSON(body, &cb); err != nil {
				b.Fatal(err)
			}
		}
	})
}
