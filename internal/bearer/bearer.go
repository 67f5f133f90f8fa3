// Package bearer is the one rule for the bearer tokens of every endpoint
// (the limiter's /check, gRPC and admin routes, the usage API): the
// Authorization scheme of RFC 6750, section 2.1, matched case-insensitively
// as RFC 9110, section 11.1 says of every auth-scheme, and the token
// compared in time that depends on neither its content nor its length.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"strings"
)

// Token returns the token of an Authorization header value of the Bearer
// scheme: "Bearer" in any case, one or more spaces, then the token, with
// surrounding white space ignored. ok is false for another scheme, a
// missing header or an empty token.
func Token(header string) (token string, ok bool) {
	const scheme = "bearer"
	header = strings.TrimSpace(header)
	if len(header) <= len(scheme) || !strings.EqualFold(header[:len(scheme)], scheme) || header[len(scheme)] != ' ' {
		return "", false
	}
	token = strings.TrimSpace(header[len(scheme):])
	return token, token != ""
}

// Checker holds the expected token. The zero value allows nothing. It is
// safe for concurrent use.
type Checker struct {
	sum [sha256.Size]byte
	set bool
}

// NewChecker returns a Checker for token; an empty token allows nothing
// (callers that run open without a token do not ask).
func NewChecker(token string) Checker {
	if token == "" {
		return Checker{}
	}
	return Checker{sum: sha256.Sum256([]byte(token)), set: true}
}

// Allows reports whether the Authorization header value carries the
// expected token.
func (c Checker) Allows(header string) bool {
	tok, ok := Token(header)
	return ok && c.Equal(tok)
}

// Equal reports whether presented is the expected token. Both are hashed
// first, so the comparison takes the same time whatever either holds.
func (c Checker) Equal(presented string) bool {
	sum := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(sum[:], c.sum[:]) == 1 && c.set
}
