package jsonstr

import (
	"encoding/json"
	"testing"
)

func FuzzAppendIsEncodingJSON(f *testing.F) {
	for _, s := range []string{"", "acct_8812", "api:search", `a"b\c`, "tab\there", "\x00\x1f\x7f",
		"<script>&", "ünïcode", "\u2028\u2029", "bad \xff utf-8", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := Append([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("Append(%q) = %s, encoding/json writes %s", s, got[1:], want)
		}
	})
}
