package policylog

// Authenticated writers. Every record a writer appends is signed with its
// Ed25519 key; a reader given a Keyring (POLICY_TRUSTED_KEYS_FILE) applies
// only records signed by a key in it, and records as their author the
// identity the keyring gives that key, whatever the record says.
//
// # What is signed
//
// A signed value is the record's JSON encoding (Record.Encode) followed by
// one more member, "sig": the key's id (KeyID), a colon and the base64
// signature. The signature covers the log key and the exact bytes of the
// value without the "sig" member, so nothing is re-encoded to be checked
// (what is verified is what is decoded: the two differ only by that
// member), and a record moved under another log key no longer verifies.
// The member is appended, so it is the last whatever order Record's
// fields are in.
//
// # The rule, part of the apply rule
//
// With a keyring, a value that is not signed in that form, is signed by a
// key the keyring lacks, or whose signature does not match its bytes (an
// altered record) is refused with CodeUnauthenticated before anything
// else is judged, by every reader the same way. A tombstone (no value)
// cannot be signed; it changes no state either way.
//
// # Who the author is
//
// The author a reader records is the identity of the key (AuthorOf): a
// record naming no author, or its key's identity, is that identity's; one
// naming someone else is "IDENTITY/NAME": the key's holder vouches that
// it acted for NAME (usage-api signs with its own key for the operator
// whose credential made the request). No one can appear as an author but
// under the identity of a key the keyring trusts.
//
// # Retiring and removing a key
//
// A keyring line may end with `until=N`: the key is trusted for records of
// revision N or less only. That is how a key is retired (rotated, or
// revoked when it leaked): what it signed up to N stays applied for every
// reader, a reader that starts later included, and anything it signs
// after is refused. Revisions below the head cannot be taken again (the
// apply rule refuses a parent behind the head), so a leaked key retired at
// N changes nothing more.
//
// A line removed altogether revokes every record of its key for every
// reader that reads them afterwards (a limiter that restarts or starts
// for the first time), while a reader that applied them before keeps them
// until it restarts: the keyring is read at start, and a record is judged
// when it is read. On a log that still holds such a record, a reader that
// refuses it then refuses what was written on top of it as conflicts
// (their parent is ahead of its head): so remove a line only once nothing
// its key signed is left in the log (superseded and compacted away), and
// retire it with until= before.

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// CodeUnauthenticated refuses a record that is not signed by a key of the
// reader's keyring, or whose bytes do not match its signature.
const CodeUnauthenticated = "unauthenticated"

// ErrUnauthenticated is wrapped by the errors of Keyring.Authenticate.
var ErrUnauthenticated = errors.New("unauthenticated record")

// signDomain prefixes every signed message, so that a signature of a
// policy record is never valid for anything else signed by the same key.
const signDomain = "ratewarden policy record v1\x00"

// keyIDLen is the length of a key id: 16 hex digits (the first 8 bytes of
// the SHA-256 of the public key).
const keyIDLen = 16

// A signed value ends with `,"sig":"<key id>:<base64 of 64 bytes>"}`.
const (
	sigMember    = `,"sig":"`
	sigB64Len    = 88 // base64.StdEncoding of ed25519.SignatureSize bytes
	sigSuffixLen = len(sigMember) + keyIDLen + 1 + sigB64Len + len(`"}`)
)

// KeyID is the id a signed record names its key by.
func KeyID(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:keyIDLen/2])
}

// identityPattern is what an identity may be: it is the author in history
// and audit, and a field of one keyring line.
var identityPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$`)

// ValidIdentity reports whether id may name a writer.
func ValidIdentity(id string) bool { return identityPattern.MatchString(id) }

type trustedKey struct {
	identity string
	pub      ed25519.PublicKey
	until    int64  // the last revision the key may sign; 0 = any
	role     string // what it may sign (roles.go)
}

// Keyring is the writers a reader trusts: an identity per Ed25519 public
// key. Safe for concurrent use (it never changes once parsed).
type Keyring struct {
	byID map[string]trustedKey
}

// ParseKeyring reads a keyring: one writer per line, `IDENTITY KEY
// [until=N] [role=R]`, KEY being the base64 body of the public key's PEM (a PKIX
// SubjectPublicKeyInfo) on one line, until= retiring it after revision
// N and role= bounding what it may sign (roles.go; default writer); blank lines and lines starting with '#' are skipped. Every malformed
// line is reported.
func ParseKeyring(r io.Reader) (*Keyring, error) {
	k := &Keyring{byID: map[string]trustedKey{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	var errs []error
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 4 {
			errs = append(errs, fmt.Errorf("line %d: want IDENTITY KEY [until=REVISION] [role=ROLE], got %d fields", n, len(f)))
			continue
		}
		var until int64
		role, bad := RoleWriter, false
		for _, opt := range f[2:] {
			if v, ok := strings.CutPrefix(opt, "role="); ok {
				if !validRole(v) {
					errs = append(errs, fmt.Errorf("line %d (%s): %q: want role=%s, role=%s or role=%s", n, f[0], opt, RoleWriter, RoleSupport, RoleRead))
					bad = true
				}
				role = v
				continue
			}
			v, ok := strings.CutPrefix(opt, "until=")
			u, err := strconv.ParseInt(v, 10, 64)
			if !ok || err != nil || u < 1 {
				errs = append(errs, fmt.Errorf("line %d (%s): %q: want until=REVISION, a revision of 1 or more", n, f[0], opt))
				bad = true
				continue
			}
			until = u
		}
		if bad {
			continue
		}
		if !ValidIdentity(f[0]) {
			errs = append(errs, fmt.Errorf("line %d: identity %q: letters, digits and ._@+- only, at most 128", n, f[0]))
			continue
		}
		pub, err := parsePublicKey(f[1])
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d (%s): %w", n, f[0], err))
			continue
		}
		id := KeyID(pub)
		if prev, ok := k.byID[id]; ok {
			errs = append(errs, fmt.Errorf("line %d: the key of %s is already %s's", n, f[0], prev.identity))
			continue
		}
		k.byID[id] = trustedKey{identity: f[0], pub: pub, until: until, role: role}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	return k, nil
}

// LoadKeyring reads the keyring file at path (POLICY_TRUSTED_KEYS_FILE).
func LoadKeyring(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	defer f.Close()
	k, err := ParseKeyring(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

func parsePublicKey(b64 string) (ed25519.PublicKey, error) {
	der, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("the key is not base64: %v", err)
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("the key is not a public key: %v", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the key is a %T, not Ed25519", k)
	}
	return pub, nil
}

// Len is the number of keys.
func (k *Keyring) Len() int { return len(k.byID) }

// Identity is the identity of pub, when the keyring holds it.
func (k *Keyring) Identity(pub ed25519.PublicKey) (string, bool) {
	t, ok := k.byID[KeyID(pub)]
	if !ok || !t.pub.Equal(pub) {
		return "", false
	}
	return t.identity, true
}

// Authenticate checks the signature of value, read under log key key, and
// returns the identity of the key that signed it and the last revision
// the key may sign (0 = any: the caller checks the record's); the error
// (wrapping ErrUnauthenticated) says why a value is refused.
func (k *Keyring) Authenticate(key string, value []byte) (identity string, until int64, err error) {
	identity, until, _, err = k.check(key, value, nil)
	return identity, until, err
}

// check is Authenticate that takes the signature as checked when vouched
// says that its digest (checked.go) was checked before; sum is the digest.
func (k *Keyring) check(key string, value []byte, vouched func([16]byte) bool) (identity string, until int64, sum [16]byte, err error) {
	unsigned, sig, id, ok := splitSigned(value)
	if !ok {
		return "", 0, sum, fmt.Errorf("%w: not signed", ErrUnauthenticated)
	}
	t, ok := k.byID[id]
	if !ok {
		return "", 0, sum, fmt.Errorf("%w: signed by key %s, which the keyring does not hold", ErrUnauthenticated, id)
	}
	if t.role != RoleWriter {
		return "", 0, sum, fmt.Errorf("%w: signed by key %s (%s), whose role %q may not write the policy log", ErrUnauthenticated, id, t.identity, t.role)
	}
	sum = checkedSum(t.pub, key, value)
	if vouched != nil && vouched(sum) {
		return t.identity, t.until, sum, nil
	}
	if !ed25519.Verify(t.pub, signedMessage(key, unsigned), sig) {
		return "", 0, sum, badSignature(id, t.identity)
	}
	return t.identity, t.until, sum, nil
}

// errBadSignature marks a value signed in form by a trusted key whose
// signature does not hold: the one verdict that takes a verification
// (checkpoint.go lists such offsets).
var errBadSignature = errors.New("bad signature")

func badSignature(id, identity string) error {
	return fmt.Errorf("%w: the signature of key %s (%s) does not match the record (altered, or moved to another log key)%w",
		ErrUnauthenticated, id, identity, quiet{errBadSignature})
}

// quiet wraps an error for errors.Is without adding to the message.
type quiet struct{ err error }

func (q quiet) Error() string { return "" }
func (q quiet) Unwrap() error { return q.err }

// identify is check without the verification: the key's identity and
// until= for a value signed in form by a key of the keyring, or why it is
// refused without looking at the signature (unsigned, an unknown key).
// A checkpoint (checkpoint.go) vouches for the rest.
func (k *Keyring) identify(value []byte) (identity, id string, until int64, err error) {
	_, id, ok := signedForm(value)
	if !ok {
		return "", "", 0, fmt.Errorf("%w: not signed", ErrUnauthenticated)
	}
	t, ok := k.byID[id]
	if !ok {
		return "", id, 0, fmt.Errorf("%w: signed by key %s, which the keyring does not hold", ErrUnauthenticated, id)
	}
	return t.identity, id, t.until, nil
}

// splitSigned takes a signed value apart: the value without its "sig"
// member (what was signed), the signature and the key id; ok is false when
// value is not in the signed form.
func splitSigned(value []byte) (unsigned, sig []byte, id string, ok bool) {
	s, id, ok := signedForm(value)
	if !ok {
		return nil, nil, "", false
	}
	head := value[:len(value)-sigSuffixLen]
	unsigned = append(append(make([]byte, 0, len(head)+1), head...), '}')
	return unsigned, s[:], id, true
}

// signedForm is splitSigned without a copy of the value: the signature
// and the key id of a value in the signed form.
func signedForm(value []byte) (sig [ed25519.SignatureSize]byte, id string, ok bool) {
	n := len(value)
	if n < sigSuffixLen+1 || !bytes.HasSuffix(value, []byte(`"}`)) {
		return sig, "", false
	}
	s := value[n-sigSuffixLen:]
	if !bytes.HasPrefix(s, []byte(sigMember)) {
		return sig, "", false
	}
	s = s[len(sigMember):]
	var idBytes [keyIDLen / 2]byte
	if _, err := hex.Decode(idBytes[:], s[:keyIDLen]); err != nil || bytes.ContainsAny(s[:keyIDLen], "ABCDEF") || s[keyIDLen] != ':' {
		return sig, "", false
	}
	// Decode needs room for what 88 characters can hold (66 bytes) even
	// when they end without the padding a 64-byte value has.
	var buf [66]byte
	m, err := base64.StdEncoding.Strict().Decode(buf[:], s[keyIDLen+1:keyIDLen+1+sigB64Len]) // one encoding per signature
	if err != nil || m != ed25519.SignatureSize {
		return sig, "", false
	}
	copy(sig[:], buf[:m])
	return sig, string(s[:keyIDLen]), true
}

func signedMessage(key string, unsigned []byte) []byte {
	m := make([]byte, 0, len(signDomain)+len(key)+1+len(unsigned))
	m = append(append(append(append(m, signDomain...), key...), 0), unsigned...)
	return m
}

// Signer signs the records a writer appends (POLICY_SIGNING_KEY_FILE).
type Signer struct {
	priv ed25519.PrivateKey
	id   string
}

// NewSigner returns the signer of priv.
func NewSigner(priv ed25519.PrivateKey) *Signer {
	return &Signer{priv: priv, id: KeyID(priv.Public().(ed25519.PublicKey))}
}

// ParseSigner reads an Ed25519 private key in PKCS#8 PEM (what `openssl
// genpkey -algorithm ed25519` and GenerateKey write).
func ParseSigner(pemBytes []byte) (*Signer, error) {
	blk, _ := pem.Decode(pemBytes)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("signing key: not a PEM block of type PRIVATE KEY (PKCS#8)")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key: a %T, not Ed25519", k)
	}
	return NewSigner(priv), nil
}

// LoadSigner reads the signing key file at path.
func LoadSigner(path string) (*Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	s, err := ParseSigner(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Public is the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.priv.Public().(ed25519.PublicKey) }

// KeyID is the id its records name.
func (s *Signer) KeyID() string { return s.id }

// KeyringLine is the keyring line that trusts this signer as identity.
func (s *Signer) KeyringLine(identity string) string {
	der, _ := x509.MarshalPKIXPublicKey(s.Public()) // an Ed25519 key always marshals
	return identity + " " + base64.StdEncoding.EncodeToString(der)
}

// PEM is the private key in PKCS#8 PEM.
func (s *Signer) PEM() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(s.priv) // an Ed25519 key always marshals
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// GenerateSigner makes a new key.
func GenerateSigner() (*Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return NewSigner(priv), nil
}

// Encode is rec's log value, signed (any previous signature dropped).
func (s *Signer) Encode(rec *Record) ([]byte, error) {
	r := *rec
	r.Sig = ""
	b, err := json.Marshal(&r)
	if err != nil {
		return nil, err
	}
	sig := ed25519.Sign(s.priv, signedMessage(r.LogKey(), b))
	out := make([]byte, 0, len(b)+sigSuffixLen)
	out = append(append(out, b[:len(b)-1]...), sigMember...)
	out = append(append(out, s.id...), ':')
	out = base64.StdEncoding.AppendEncode(out, sig)
	return append(out, `"}`...), nil
}

// AuthorOf is the author recorded for a record signed by identity's key
// that names itself declared (see "Who the author is").
func AuthorOf(identity, declared string) string {
	if declared == "" || declared == identity {
		return identity
	}
	return identity + "/" + declared
}

// Keys is what a process signs with and judges by: POLICY_SIGNING_KEY_FILE
// and POLICY_TRUSTED_KEYS_FILE; a nil member is unset.
type Keys struct {
	Signer *Signer
	Ring   *Keyring
}

// LoadKeys reads the signing key file and the keyring file, each when its
// path is not empty. With both, the signing key must be in the keyring:
// what it signs would be refused otherwise.
func LoadKeys(signingKeyFile, trustedKeysFile string) (Keys, error) {
	var k Keys
	var errs []error
	var err error
	if signingKeyFile != "" {
		if k.Signer, err = LoadSigner(signingKeyFile); err != nil {
			errs = append(errs, err)
		}
	}
	if trustedKeysFile != "" {
		if k.Ring, err = LoadKeyring(trustedKeysFile); err != nil {
			errs = append(errs, err)
		}
	}
	if k.Signer != nil && k.Ring != nil {
		if _, ok := k.Ring.Identity(k.Signer.Public()); !ok {
			errs = append(errs, fmt.Errorf("the signing key (id %s) is not in the keyring %s: what it signs would be refused", k.Signer.KeyID(), trustedKeysFile))
		}
	}
	return k, errors.Join(errs...)
}

// Use makes c judge by the keyring and sign with the signer, when set.
func (k Keys) Use(c *Client) {
	c.Authenticate(k.Ring)
	if k.Signer != nil {
		c.Sign(k.Signer)
	}
}
