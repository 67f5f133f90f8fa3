// Package httpapi is the limiter's HTTP surface: the POST /check handler for
// services in any language, and net/http middleware (with client-address
// keying behind trusted proxies) for Go services that embed the limiter.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/ratewarden/ratewarden/enforcement"

	"github.com/ratewarden/ratewarden/limits"
)

// Limits of a /check request, from the contract (package limits).
const (
	MaxBodyBytes = limits.MaxRequestBytes
	MaxKeyBytes  = limits.MaxKeyBytes
	MaxScopeLen  = limits.MaxScopeBytes
	MaxTierLen   = limits.MaxTierBytes
	MaxCost      = limits.MaxCost
)

// Error is an API error with its HTTP status and contract code.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func invalid(format string, args ...any) *Error {
	return &Error{Status: 400, Code: "invalid_request", Message: fmt.Sprintf(format, args...)}
}

type checkBody struct {
	Key   *string         `json:"key"`
	Scope *string         `json:"scope"`
	Cost  json.RawMessage `json:"cost"`
	Tier  *string         `json:"tier"`
	// Reserve: the cost is an estimate; an allowed answer carries the
	// reservation to settle (POST /settle).
	Reserve *bool `json:"reserve"`
	// Peek: answer as /check would, spending nothing and recording
	// nothing (enforcement.Request.Peek). Rare: the general decoder reads it.
	Peek *bool `json:"peek"`
	// Priority is the request's class on a concurrency limit (policy
	// priorities; absent = default).
	Priority *string `json:"priority"`
}

// DecodeCheck parses a /check body. Unknown fields are ignored; known fields
// of the wrong type, missing or oversized fields, a key, scope or tier that
// is not valid UTF-8 or holds a control character (TextProblem) and a cost
// that is not an integer in [0, 1e9] are refused with a message that names
// the field.
func DecodeCheck(body []byte) (enforcement.Request, *Error) {
	b, ok := scanCheck(body) // the common, simple body without reflection
	if !ok {
		b = checkBody{}
		if apiErr := decodeCheckJSON(body, &b); apiErr != nil {
			return enforcement.Request{}, apiErr
		}
	}
	return validateCheck(&b)
}

// decodeCheckJSON is the general decoder: any valid JSON, with encoding/json's
// rules (case-insensitive names, the last of repeated fields, escapes).
func decodeCheckJSON(body []byte, b *checkBody) *Error {
	if err := json.Unmarshal(body, b); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return invalid("%s must be a %s", typeErr.Field, wantType(typeErr.Field))
		}
		return invalid("body is not a JSON object: %v", err)
	}
	if !utf8.Valid(body) {
		return invalidUTF8(body)
	}
	return nil
}

// invalidUTF8 names the member of a decoded body whose string held bytes
// that are not UTF-8 (RFC 8259 requires UTF-8). encoding/json replaces them
// with U+FFFD, which would make different keys one bucket and record a key
// nobody sent; the raw member shows what was sent. Invalid bytes in a member
// the limiter ignores are ignored with it.
func invalidUTF8(body []byte) *Error {
	var raw struct{ Key, Scope, Tier, Priority json.RawMessage }
	if err := json.Unmarshal(body, &raw); err != nil {
		return invalid("body is not a JSON object: %v", err)
	}
	for _, m := range []struct {
		name string
		v    json.RawMessage
	}{{"key", raw.Key}, {"scope", raw.Scope}, {"tier", raw.Tier}, {"priority", raw.Priority}} {
		if !utf8.Valid(m.v) {
			return invalid("%s is not valid UTF-8", m.name)
		}
	}
	return nil
}

// validateCheck applies the contract's bounds to a decoded body.
func validateCheck(b *checkBody) (enforcement.Request, *Error) {
	var req enforcement.Request
	switch {
	case b.Key == nil || *b.Key == "":
		return req, invalid("key is required")
	case len(*b.Key) > MaxKeyBytes:
		return req, invalid("key is %d bytes, at most %d allowed", len(*b.Key), MaxKeyBytes)
	case b.Scope == nil || *b.Scope == "":
		return req, invalid("scope is required")
	case len(*b.Scope) > MaxScopeLen:
		return req, invalid("scope is %d bytes, at most %d allowed", len(*b.Scope), MaxScopeLen)
	case b.Tier != nil && len(*b.Tier) > MaxTierLen:
		return req, invalid("tier is %d bytes, at most %d allowed", len(*b.Tier), MaxTierLen)
	case b.Priority != nil && len(*b.Priority) > MaxTierLen:
		return req, invalid("priority is %d bytes, at most %d allowed", len(*b.Priority), MaxTierLen)
	}
	if p := TextProblem(*b.Key); p != "" {
		return req, invalid("key %s", p)
	}
	if p := TextProblem(*b.Scope); p != "" {
		return req, invalid("scope %s", p)
	}
	if b.Tier != nil {
		if p := TextProblem(*b.Tier); p != "" {
			return req, invalid("tier %s", p)
		}
	}
	if b.Priority != nil {
		if p := TextProblem(*b.Priority); p != "" {
			return req, invalid("priority %s", p)
		}
		req.Priority = *b.Priority
	}
	req.Key, req.Scope = *b.Key, *b.Scope
	if b.Tier != nil {
		req.Tier = *b.Tier
	}
	if raw := bytes.TrimSpace(b.Cost); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		cost, err := parseCost(raw)
		if err != nil {
			return enforcement.Request{}, err
		}
		req.Cost, req.HasCost = cost, true
	}
	req.Reserve = b.Reserve != nil && *b.Reserve
	req.Peek = b.Peek != nil && *b.Peek
	return req, nil
}

func wantType(field string) string {
	switch field {
	case "cost":
		return "number"
	case "reserve":
		return "boolean"
	}
	return "string"
}

var errCost = invalid("cost must be an integer ≥ 0 and ≤ %d", MaxCost)

func parseCost(raw []byte) (int64, *Error) {
	if raw[0] == '"' || raw[0] == '[' || raw[0] == '{' || raw[0] == 't' || raw[0] == 'f' {
		return 0, invalid("cost must be a number")
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		if n < 0 || n > MaxCost {
			return 0, errCost
		}
		return n, nil
	}
	// Exponent forms such as 1e3 are integers too; fractions are not.
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || f < 0 || f > MaxCost {
		return 0, errCost
	}
	return int64(f), nil
}
