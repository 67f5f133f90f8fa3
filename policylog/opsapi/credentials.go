package opsapi

// Operators' credentials: each bearer token is an identity with a role
// (USAGE_ADMIN_TOKENS_FILE, lines `IDENTITY ROLE TOKEN`; USAGE_ADMIN_TOKEN
// is identity "admin" with role "policy"). The identity is the author of
// what the request writes, whatever its body says; the role bounds what
// it may do. The file is read again when it changes (its size or
// modification time), checked on each request, so a line removed stops
// its token at the next request, with no restart and nothing running in
// the background. A file that no longer parses refuses every token it
// held until it is fixed: a half-edited file never keeps a removed token
// alive.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/policylog"
)

// Roles, each allowing what the one before allows and more.
const (
	RoleRead      = "read"      // the GET routes
	RoleOverrides = "overrides" // and writes of overrides
	RolePolicy    = "policy"    // and pushes and rollbacks of the document
)

var roleRank = map[string]int{RoleRead: 1, RoleOverrides: 2, RolePolicy: 3}

// AdminIdentity is the identity of USAGE_ADMIN_TOKEN.
const AdminIdentity = "admin"

// MinToken is the shortest token accepted, in bytes.
const MinToken = 16

// Principal is who a credential is.
type Principal struct {
	Identity string
	Role     string
}

// may reports whether p's role allows what role allows.
func (p Principal) may(role string) bool { return roleRank[p.Role] >= roleRank[role] }

// Credentials maps bearer tokens to principals. Safe for concurrent use.
type Credentials struct {
	path   string
	static map[[sha256.Size]byte]Principal // USAGE_ADMIN_TOKEN

	mu    sync.Mutex
	mod   time.Time
	size  int64
	table map[[sha256.Size]byte]Principal
	err   error // why the file's tokens are refused (it no longer parses)

	// OnChange, when set, is told of each new version of the file read:
	// nil when it was loaded, else why its tokens are refused. Set it
	// before the first request.
	OnChange func(err error)
}

// NewCredentials reads the credentials file at path (empty = none) beside
// adminToken (empty = none). The first read must succeed.
func NewCredentials(path, adminToken string) (*Credentials, error) {
	c := &Credentials{path: path, static: map[[sha256.Size]byte]Principal{}}
	if adminToken != "" {
		c.static[sha256.Sum256([]byte(adminToken))] = Principal{Identity: AdminIdentity, Role: RolePolicy}
	}
	if path == "" {
		if adminToken == "" {
			return nil, errors.New("no operator credential: set USAGE_ADMIN_TOKEN or USAGE_ADMIN_TOKENS_FILE")
		}
		return c, nil
	}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Lookup is the principal of token; ok is false for a token no credential
// holds. Its error is not nil while the file cannot be used (then only
// USAGE_ADMIN_TOKEN is accepted).
func (c *Credentials) Lookup(token string) (p Principal, ok bool, err error) {
	sum := sha256.Sum256([]byte(token))
	if p, ok := c.static[sum]; ok {
		return p, true, nil
	}
	if c.path == "" {
		return Principal{}, false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err = c.reload()
	p, ok = c.table[sum]
	return p, ok, err
}

// reload reads the file again when it changed; it holds c.mu.
func (c *Credentials) reload() error {
	st, err := os.Stat(c.path)
	if err != nil {
		c.table, c.err = nil, fmt.Errorf("USAGE_ADMIN_TOKENS_FILE: %w", err)
		c.mod, c.size = time.Time{}, -1
		return c.err
	}
	if st.ModTime().Equal(c.mod) && st.Size() == c.size {
		return c.err
	}
	b, err := os.ReadFile(c.path)
	if err == nil {
		var t map[[sha256.Size]byte]Principal
		if t, err = parseCredentials(b, c.static); err == nil {
			c.table, c.err, c.mod, c.size = t, nil, st.ModTime(), st.Size()
			c.changed(nil)
			return nil
		}
	}
	c.table, c.err = nil, fmt.Errorf("USAGE_ADMIN_TOKENS_FILE %s: %w (its tokens are refused until it is fixed)", c.path, err)
	c.mod, c.size = st.ModTime(), st.Size()
	c.changed(c.err)
	return c.err
}

func (c *Credentials) changed(err error) {
	if c.OnChange != nil {
		c.OnChange(err)
	}
}

// parseCredentials reads lines `IDENTITY ROLE TOKEN` (blank lines and
// lines starting with '#' skipped), reporting every bad line by number
// only: a line holds a secret.
func parseCredentials(b []byte, static map[[sha256.Size]byte]Principal) (map[[sha256.Size]byte]Principal, error) {
	t := map[[sha256.Size]byte]Principal{}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) != 3:
			errs = append(errs, fmt.Errorf("line %d: want IDENTITY ROLE TOKEN, got %d fields", n, len(f)))
			continue
		case !policylog.ValidIdentity(f[0]):
			errs = append(errs, fmt.Errorf("line %d: %q is not an identity (letters, digits and ._@+-)", n, f[0]))
			continue
		case roleRank[f[1]] == 0:
			errs = append(errs, fmt.Errorf("line %d (%s): role %q is not read, overrides or policy", n, f[0], f[1]))
			continue
		case len(f[2]) < MinToken:
			errs = append(errs, fmt.Errorf("line %d (%s): the token is shorter than %d bytes", n, f[0], MinToken))
			continue
		}
		sum := sha256.Sum256([]byte(f[2]))
		if _, dup := t[sum]; dup {
			errs = append(errs, fmt.Errorf("line %d (%s): the token is another line's", n, f[0]))
			continue
		}
		if _, dup := static[sum]; dup {
			errs = append(errs, fmt.Errorf("line %d (%s): the token is USAGE_ADMIN_TOKEN", n, f[0]))
			continue
		}
		t[sum] = Principal{Identity: f[0], Role: f[1]}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	return t, errors.Join(errs...)
}
