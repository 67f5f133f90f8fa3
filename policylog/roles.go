package policylog

// Roles of the keyring. A keyring line may end with `role=R`: what the
// key's signature is accepted for. The policy log accepts records of
// writers only; a support reset (the limiter's POST /admin/keys/reset,
// `limiter key reset`) accepts writers and support. So the engineer who
// answers customers can set a key right without being able to change
// the policy, and a read key signs nothing anyone accepts.

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strings"
)

// Keyring roles.
const (
	RoleWriter  = "writer"  // the policy log's records, and resets (the default)
	RoleSupport = "support" // resets only
	RoleRead    = "read"    // nothing: an identity that may only look
)

func validRole(r string) bool { return r == RoleWriter || r == RoleSupport || r == RoleRead }

// docDomain prefixes every signed support document, so that its
// signature is never valid as a policy record's, nor the other way round.
const docDomain = "ratewarden support document v1\x00"

// SignDocument signs doc (a support request's exact bytes) and returns
// the signature as "<key id>:<base64>", for VerifyDocument.
func (s *Signer) SignDocument(doc []byte) string {
	sig := ed25519.Sign(s.priv, append([]byte(docDomain), doc...))
	return s.id + ":" + base64.StdEncoding.EncodeToString(sig)
}

// VerifyDocument checks sig (SignDocument's) over doc and returns the
// identity and role of the key that made it; the error wraps
// ErrUnauthenticated: not signed, signed by a key the keyring lacks, or
// altered.
func (k *Keyring) VerifyDocument(doc []byte, sig string) (identity, role string, err error) {
	id, b64, ok := strings.Cut(sig, ":")
	if !ok {
		return "", "", fmt.Errorf("%w: not signed", ErrUnauthenticated)
	}
	t, ok := k.byID[id]
	if !ok {
		return "", "", fmt.Errorf("%w: signed by key %s, which the keyring does not hold", ErrUnauthenticated, id)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || !ed25519.Verify(t.pub, append([]byte(docDomain), doc...), raw) {
		return "", "", badSignature(id, t.identity)
	}
	return t.identity, t.role, nil
}
