package httpapi

import "unicode/utf8"

// scanCheck decodes the body every well-behaved client sends — one flat
// object whose members are among key, scope, tier and priority (plain
// strings or null), cost (a plain integer or null) and reserve (true, false or null),
// each at most once — without
// reflection or allocations beyond the strings. Anything else (escapes,
// other members, nesting, odd numbers, invalid UTF-8, syntax errors) returns
// ok = false and takes the general decoder, so both always agree: the fuzz
// test compares them.
func scanCheck(body []byte) (b checkBody, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return b, false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return b, skipSpace(body, i+1) == len(body)
	}
	var seen [6]bool
	for {
		name, j, ok := scanPlainString(body, i)
		if !ok {
			return b, false
		}
		i = skipSpace(body, j)
		if i >= len(body) || body[i] != ':' {
			return b, false
		}
		i = skipSpace(body, i+1)
		field := -1
		switch string(name) { // no allocation: the compiler compares in place
		case "key":
			field = 0
		case "scope":
			field = 1
		case "tier":
			field = 2
		case "cost":
			field = 3
		case "reserve":
			field = 4
		case "priority":
			field = 5
		}
		if field < 0 || seen[field] {
			return b, false
		}
		seen[field] = true
		if isNull(body, i) {
			i += 4
		} else if field == 4 {
			v, j, ok := scanBool(body, i)
			if !ok {
				return b, false
			}
			b.Reserve = &v
			i = j
		} else if field == 3 {
			j := scanPlainInt(body, i)
			if j == i {
				return b, false
			}
			b.Cost = body[i:j]
			i = j
		} else {
			v, j, ok := scanPlainString(body, i)
			if !ok {
				return b, false
			}
			s := string(v)
			switch field {
			case 0:
				b.Key = &s
			case 1:
				b.Scope = &s
			case 2:
				b.Tier = &s
			case 5:
				b.Priority = &s
			}
			i = j
		}
		i = skipSpace(body, i)
		if i >= len(body) {
			return b, false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return b, skipSpace(body, i+1) == len(body)
		default:
			return b, false
		}
	}
}

// scanBool reads the literal true or false at i.
func scanBool(b []byte, i int) (v bool, next int, ok bool) {
	switch {
	case len(b)-i >= 4 && string(b[i:i+4]) == "true":
		return true, i + 4, true
	case len(b)-i >= 5 && string(b[i:i+5]) == "false":
		return false, i + 5, true
	}
	return false, i, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func isNull(b []byte, i int) bool {
	return len(b)-i >= 4 && string(b[i:i+4]) == "null"
}

// scanPlainString reads a JSON string at i that has no escapes and is valid
// UTF-8; it returns its contents and the index after the closing quote.
func scanPlainString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	start := i + 1
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			v := b[start:j]
			return v, j + 1, utf8.Valid(v)
		case c == '\\' || c < 0x20:
			return nil, i, false
		}
	}
	return nil, i, false
}

// scanPlainInt reads -?(0|[1-9][0-9]*) at i, not followed by a fraction or
// an exponent, and returns the index after it (i when there is none).
func scanPlainInt(b []byte, i int) int {
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
	default:
		return i
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E' || (b[j] >= '0' && b[j] <= '9')) {
		return i
	}
	return j
}

// scanSettle decodes the /settle body a well-behaved client sends — one
// flat object with at most one "reservation" (a plain string) and one
// "cost" (a plain integer), in either order — without reflection.
// Anything else returns ok = false and takes the general decoder
// (DecodeSettle), so both always agree: the fuzz test compares them.
func scanSettle(body []byte) (id []byte, cost []byte, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, nil, false
	}
	i = skipSpace(body, i+1)
	var seenID, seenCost bool
	for {
		name, j, ok := scanPlainString(body, i)
		if !ok {
			return nil, nil, false
		}
		i = skipSpace(body, j)
		if i >= len(body) || body[i] != ':' {
			return nil, nil, false
		}
		i = skipSpace(body, i+1)
		switch string(name) {
		case "reservation":
			v, j, ok := scanPlainString(body, i)
			if !ok || seenID {
				return nil, nil, false
			}
			id, seenID, i = v, true, j
		case "cost":
			j := scanPlainInt(body, i)
			if j == i || seenCost {
				return nil, nil, false
			}
			cost, seenCost, i = body[i:j], true, j
		default:
			return nil, nil, false
		}
		i = skipSpace(body, i)
		if i >= len(body) {
			return nil, nil, false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return id, cost, seenID && seenCost && skipSpace(body, i+1) == len(body)
		default:
			return nil, nil, false
		}
	}
}
