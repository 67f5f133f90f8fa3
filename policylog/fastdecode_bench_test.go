package policylog

import "testing"

// BenchmarkDecodeOverrideRecord compares the two decoders of an override
// record as a writer encodes it: decodeOverride, the fast path, and
// decodeJSON (encoding/json), which every other record takes. The figures
// are in BENCHMARKS.md, "Hand-written code against the library".
func BenchmarkDecodeOverrideRecord(b *testing.B) {
	r := writersRecords()[0]
	value, err := r.Encode()
	if err != nil {
		b.Fatal(err)
	}
	key := r.LogKey()
	b.Run("decodeOverride", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeOverride(value); !ok {
				b.Fatal("not taken")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeJSON(key, value); err != nil {
				b.Fatal(err)
			}
		}
	})
}
