package httpapi

import (
	"fmt"
	"unicode/utf8"
)

// TextProblem says why s cannot be a key, scope or tier, or "" when it can.
// The rule, for /check and the Envoy rate limit service alike: the text is
// valid UTF-8 without control characters (U+0000–U+001F, U+007F). Beyond
// that a key stays opaque. Every place a key goes downstream is text: the
// decision event is JSON (invalid UTF-8 would be rewritten to U+FFFD there,
// so the record would name another key than the bucket's), ClickHouse and
// the dashboard show it, logs and hot-key metrics carry it; a NUL, a newline
// or an escape sequence there breaks a line, a CSV cell or a terminal, and
// no real key needs one. Refused up front, nothing is spent or recorded.
func TextProblem(s string) string {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return fmt.Sprintf("has a control character (U+%04X) at byte %d", c, i)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return fmt.Sprintf("is not valid UTF-8 (byte %d)", i)
		}
		i += n
	}
	return ""
}
