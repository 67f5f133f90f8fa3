package ratelimitheader

import "strconv"

// The RFC 9651 serialisation rules this package needs, and no more: a List
// of Items whose bare items are Strings, with Integer parameters. Every
// value the functions below can be given serialises to a valid field:
// nothing is ever refused at run time.

// maxInteger is the largest magnitude of an sf-integer (15 digits).
const maxInteger = 999_999_999_999_999

// appendInteger appends n as an sf-integer, clamped to ±maxInteger: a value
// out of range is reported as the nearest one the grammar allows.
func appendInteger(b []byte, n int64) []byte {
	return strconv.AppendInt(b, min(max(n, -maxInteger), maxInteger), 10)
}

// appendParamInteger appends ";key=n" with n clamped at 0 below (every
// parameter the draft defines is non-negative). key must be a valid
// sf-key; the package's keys are constants checked by a test.
func appendParamInteger(b []byte, key string, n int64) []byte {
	b = append(b, ';')
	b = append(b, key...)
	b = append(b, '=')
	return appendInteger(b, max(0, n))
}

// appendString appends name+suffix as one sf-string. An sf-string holds
// printable ASCII only (0x20 to 0x7E), with '"' and '\' escaped by a
// backslash. A policy name may hold anything, so every byte outside that
// range, and '%' itself, is written as %XX (uppercase hex): the rule is
// reversible (percent-decoding the string gives the name's bytes back,
// UTF-8 included) and never produces an invalid field.
func appendString(b []byte, name, suffix string) []byte {
	b = append(b, '"')
	b = appendEscaped(b, name)
	b = appendEscaped(b, suffix)
	return append(b, '"')
}

func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '%' || c < 0x20 || c > 0x7e:
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return b
}
