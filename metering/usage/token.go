package usage

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Portal tokens are self-contained and signed:
//
//	rwpt1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "rwpt1." + claims part))>
//
// The claims name the token id, the one key it may read and its expiry. The
// signature is checked in constant time before anything in the claims is
// trusted; a revoked id is refused by the revocation store (persisted in
// ClickHouse), so a token dies before its expiry when an operator says so.

const tokenPrefix = "rwpt1."

// Token errors. Callers branch on them to answer 401.
var (
	ErrTokenMalformed = errors.New("portal token is malformed")
	ErrTokenSignature = errors.New("portal token signature is invalid")
	ErrTokenExpired   = errors.New("portal token has expired")
	ErrTokenRevoked   = errors.New("portal token has been revoked")
)

// Claims is what a portal token asserts.
type Claims struct {
	ID       string `json:"id"`  // random, "pt_" + 32 hex digits
	Key      string `json:"key"` // the only rate-limit key the token may read
	IssuedAt int64  `json:"iat"` // seconds since the Unix epoch
	Expires  int64  `json:"exp"` // seconds since the Unix epoch; the token is refused from this instant on
}

// ExpiresAt is Expires as a time in UTC.
func (c Claims) ExpiresAt() time.Time { return time.Unix(c.Expires, 0).UTC() }

// Signer issues and verifies portal tokens with one secret. It is immutable
// and safe for concurrent use.
type Signer struct {
	secret []byte
}

// MinSecretLen is the shortest accepted USAGE_TOKEN_SECRET, in bytes.
const MinSecretLen = 16

// NewSigner returns a Signer for secret, which must be at least MinSecretLen bytes.
func NewSigner(secret []byte) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("token secret must be at least %d bytes, got %d", MinSecretLen, len(secret))
	}
	return &Signer{secret: append([]byte(nil), secret...)}, nil
}

// NewTokenID returns a fresh random token id.
func NewTokenID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("token id: %w", err)
	}
	return "pt_" + hex.EncodeToString(b[:]), nil
}

// Issue returns a token for key that is valid from now for ttl.
func (s *Signer) Issue(key string, now time.Time, ttl time.Duration) (string, Claims, error) {
	id, err := NewTokenID()
	if err != nil {
		return "", Claims{}, err
	}
	c := Claims{ID: id, Key: key, IssuedAt: now.Unix(), Expires: now.Add(ttl).Unix()}
	tok, err := s.Sign(c)
	return tok, c, err
}

// Sign encodes and signs c.
func (s *Signer) Sign(c Claims) (string, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	payload := tokenPrefix + base64.RawURLEncoding.EncodeToString(body)
	return payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(payload)), nil
}

func (s *Signer) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// maxTokenLen bounds the work done on a presented token.
const maxTokenLen = 2048

// Verify checks the signature and expiry of tok at now and returns its claims.
// It does not consult revocations.
func (s *Signer) Verify(tok string, now time.Time) (Claims, error) {
	if len(tok) > maxTokenLen || !strings.HasPrefix(tok, tokenPrefix) {
		return Claims{}, ErrTokenMalformed
	}
	dot := strings.LastIndexByte(tok, '.')
	if dot <= len(tokenPrefix) {
		return Claims{}, ErrTokenMalformed
	}
	payload, sigPart := tok[:dot], tok[dot+1:]
	sig, err := base64.RawURLEncoding.DecodeString(sigPart)
	if err != nil {
		return Claims{}, ErrTokenMalformed
	}
	if !hmac.Equal(sig, s.mac(payload)) {
		return Claims{}, ErrTokenSignature
	}
	body, err := base64.RawURLEncoding.DecodeString(payload[len(tokenPrefix):])
	if err != nil {
		return Claims{}, ErrTokenMalformed
	}
	var c Claims
	if err := json.Unmarshal(body, &c); err != nil || c.ID == "" || c.Key == "" {
		return Claims{}, ErrTokenMalformed
	}
	if now.Unix() >= c.Expires {
		return Claims{}, ErrTokenExpired
	}
	return c, nil
}
