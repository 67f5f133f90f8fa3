// Package jsonstr is the one JSON string encoding of the hand-written
// encoders (the /check answer, the decision event): byte for byte what
// encoding/json writes, so a reader cannot tell which encoder wrote a value.
package jsonstr

import (
	"encoding/json"
	"unicode/utf8"
)

// Append appends s as a JSON string exactly as encoding/json encodes it:
// printable ASCII other than '"', '\\', '<', '>' and '&' is copied (the hot
// path: keys, scopes, policy names), and a string holding anything else goes
// through encoding/json (its escapes, HTML-safe forms, U+2028/U+2029 and
// invalid UTF-8 replaced by U+FFFD). A []byte is encoded as the string it
// holds (not as base64, which encoding/json would make of it).
func Append[T string | []byte](dst []byte, s T) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(string(s)) // a string always marshals
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
