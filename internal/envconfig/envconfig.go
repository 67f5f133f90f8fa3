// Package envconfig reads a binary's configuration from environment
// variables, gathering every problem so that a bad start reports them all at
// once, each naming its variable, on one line.
package envconfig

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Reader reads variables through get (os.Getenv, or a map in tests). A
// variable that is unset or blank takes its default. Not safe for
// concurrent use.
type Reader struct {
	get  func(string) string
	errs []error
}

// New returns a Reader over get.
func New(get func(string) string) *Reader { return &Reader{get: get} }

// Fail records a problem with variable name.
func (r *Reader) Fail(name, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
}

// Err is every problem recorded, on one line ("; " between them), or nil.
func (r *Reader) Err() error {
	if err := errors.Join(r.errs...); err != nil {
		return errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}

// Raw is the variable's value, untrimmed ("" when unset).
func (r *Reader) Raw(name string) string { return r.get(name) }

// String is the trimmed value, or def.
func (r *Reader) String(name, def string) string {
	if v := strings.TrimSpace(r.get(name)); v != "" {
		return v
	}
	return def
}

// List splits a comma-separated value, dropping blanks.
func (r *Reader) List(name string) []string {
	var out []string
	for _, s := range strings.Split(r.get(name), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Int is an integer in [lo, hi], or def.
func (r *Reader) Int(name string, def, lo, hi int64) int64 {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		r.Fail(name, "%q is not an integer in [%d, %d]", v, lo, hi)
		return def
	}
	return n
}

// Float is a number ≥ 0, or def.
func (r *Reader) Float(name string, def float64) float64 {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		r.Fail(name, "%q is not a number ≥ 0", v)
		return def
	}
	return f
}

// Duration is a duration in [lo, hi] (time.ParseDuration syntax), or def.
func (r *Reader) Duration(name string, def, lo, hi time.Duration) time.Duration {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		r.Fail(name, "%q is not a duration in [%s, %s]", v, lo, hi)
		return def
	}
	return d
}

// HostPort checks that v (read from name) is host:port with a valid port.
func (r *Reader) HostPort(name, v string) {
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		r.Fail(name, "%q is not host:port", v)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		r.Fail(name, "%q has a bad port", v)
	}
}

// Secret is a secret's value: the variable itself, or the content of the file
// named by name+"_FILE" (a Kubernetes secret mounted as a file), with one
// trailing newline removed. Setting both is an error. The value is never part
// of an error message; a caller that re-reads it on SIGHUP calls Secret again.
func (r *Reader) Secret(name string) string {
	v, err := ReadSecret(r.get, name)
	if err != nil {
		r.errs = append(r.errs, err)
	}
	return v
}

// ReadSecret is Secret outside a Reader: for re-reading a rotated secret.
func ReadSecret(get func(string) string, name string) (string, error) {
	v, file := get(name), strings.TrimSpace(get(name+"_FILE"))
	switch {
	case file == "":
		return v, nil
	case v != "":
		return "", fmt.Errorf("%s and %s_FILE are both set: set one", name, name)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		// The path is configuration, not the secret: naming it helps.
		return "", fmt.Errorf("%s_FILE: %w", name, err)
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
}

// byteUnits are the suffixes Bytes accepts, binary (KiB) and decimal (KB).
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// Bytes is a size in bytes in [lo, hi]: an integer, optionally followed by
// a unit (KiB, MiB, GiB, TiB, or KB, MB, GB, TB, or B), or def.
func (r *Reader) Bytes(name string, def, lo, hi int64) int64 {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		return def
	}
	num, mult := v, int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(v, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(v, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > hi/mult || n*mult < lo {
		r.Fail(name, "%q is not a size in [%d, %d] bytes (an integer, optionally with KiB, MiB, GiB, KB, MB or GB)", v, lo, hi)
		return def
	}
	return n * mult
}
