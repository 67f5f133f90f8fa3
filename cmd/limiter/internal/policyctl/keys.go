package policyctl

// The writers' keys (docs/threat-model.md): `limiter policy keygen` makes
// one, and every verb that reads or writes the policy log signs with
// POLICY_SIGNING_KEY_FILE and judges what it reads by
// POLICY_TRUSTED_KEYS_FILE (policylog/keyring.go).

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/ratewarden/ratewarden/policylog"
)

const keygenUsage = `usage:
  limiter policy keygen IDENTITY --out FILE
      writes a new Ed25519 private key to FILE (PKCS#8 PEM, mode 0600; an
      existing FILE is left alone) and prints its keyring line, to append to
      the readers' POLICY_TRUSTED_KEYS_FILE`

// policyKeygen is `limiter policy keygen IDENTITY --out FILE`.
func policyKeygen(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy keygen", keygenUsage, stdout, stderr)
	out := f.String("out", "", "the private key's file (required)")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.args) != 1 || *out == "" {
		fmt.Fprintln(stderr, keygenUsage)
		return 2
	}
	if !policylog.ValidIdentity(f.args[0]) {
		fmt.Fprintf(stderr, "%q is not an identity: letters, digits and ._@+- only, at most 128, starting with a letter or digit\n", f.args[0])
		return 2
	}
	s, err := policylog.GenerateSigner()
	if err != nil {
		fmt.Fprintln(stderr, "keygen: "+err.Error())
		return 1
	}
	if err := writeNewFile(*out, s.PEM()); err != nil {
		fmt.Fprintln(stderr, "keygen: "+err.Error())
		return 1
	}
	fmt.Fprintln(stdout, s.KeyringLine(f.args[0]))
	return 0
}

// writeNewFile writes b to a file that must not exist yet, readable by its
// owner only: a key is never overwritten by mistake.
func writeNewFile(path string, b []byte) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists: not overwritten", path)
	}
	if err != nil {
		return err
	}
	if _, err := fh.Write(b); err != nil {
		fh.Close()
		os.Remove(path)
		return err
	}
	return fh.Close()
}

// policyKeys reads POLICY_SIGNING_KEY_FILE and POLICY_TRUSTED_KEYS_FILE.
func policyKeys(getenv func(string) string) (policylog.Keys, error) {
	k, err := policylog.LoadKeys(getenv("POLICY_SIGNING_KEY_FILE"), getenv("POLICY_TRUSTED_KEYS_FILE"))
	if err != nil {
		return k, fmt.Errorf("POLICY_SIGNING_KEY_FILE/POLICY_TRUSTED_KEYS_FILE: %w", err)
	}
	return k, nil
}

// authorDefault is --author's default: the login name, or nothing when the
// CLI signs (the key's identity is then the author; --author NAME makes it
// IDENTITY/NAME, policylog.AuthorOf).
func authorDefault(getenv func(string) string) string {
	if getenv("POLICY_SIGNING_KEY_FILE") != "" {
		return ""
	}
	return defaultAuthor()
}
