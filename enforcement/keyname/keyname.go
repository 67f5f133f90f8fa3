// Package keyname is how a rate-limit key is named where it leaves the
// limiter's memory for a place its operators do not control as closely:
// Prometheus labels (every server that scrapes the limiter keeps them for
// its whole retention) and log lines. Keys are often IP addresses or
// account ids, so by default they are named by a keyed hash: HMAC-SHA256
// of the key under a secret, truncated. The same secret gives the same
// name to the same key, so a dashboard still follows one key across
// scrapes, restarts and instances; without the secret nobody can test a
// guess (an IP address, an account id) against a name. An operator who
// accepts raw keys in those places opts in (Raw).
package keyname

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
)

// nameBytes is how much of the HMAC a name keeps: 64 bits, 16 hex digits.
// Names are compared among a few hottest keys, where a collision has odds
// of about n²/2⁶⁵; a guess cannot be tested without the secret, whatever
// the length.
const nameBytes = 8

// Namer names keys. The zero value names every key "" (use New, Random or
// Raw). It is safe for concurrent use.
type Namer struct {
	secret []byte
	raw    bool
}

// New names keys by HMAC-SHA256 under secret (not empty).
func New(secret []byte) Namer { return Namer{secret: append([]byte(nil), secret...)} }

// Random names keys under a secret drawn for this process: names do not
// reveal keys, but they change at each start and differ between
// instances, so a dashboard cannot follow a key past a restart or across
// the fleet.
func Random() Namer {
	s := make([]byte, 32)
	_, _ = rand.Read(s) // crypto/rand.Read never fails (Go 1.24)
	return Namer{secret: s}
}

// Raw names every key by itself.
func Raw() Namer { return Namer{raw: true} }

// IsRaw reports whether names are the keys themselves.
func (n Namer) IsRaw() bool { return n.raw }

// Name is key's name.
func (n Namer) Name(key string) string {
	if n.raw {
		return key
	}
	if n.secret == nil {
		return ""
	}
	m := hmac.New(sha256.New, n.secret)
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil)[:nameBytes])
}

// Choose is the namer an operator's settings ask for: raw keys, or the
// keyed hash under secret, or under a random secret of this process when
// secret is empty.
func Choose(secret string, raw bool) Namer {
	switch {
	case raw:
		return Raw()
	case secret != "":
		return New([]byte(secret))
	}
	return Random()
}
