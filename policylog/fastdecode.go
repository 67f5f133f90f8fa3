package policylog

// A limiter starting on a log of a million overrides decodes a million
// small records; through encoding/json (reflection, DisallowUnknownFields,
// then the content marshalled again for its hash) that was about 9 µs of
// CPU per record. decodeOverride is a fast path for the one shape writers
// produce: an override record exactly as Record.Encode writes it (fields
// in order, no spaces, plain ASCII strings, numbers and times as
// encoding/json writes them). Anything else, and any record it cannot
// vouch for, goes to encoding/json, so the fast path never decides
// differently: when it returns a record, encoding/json returns the same
// one (FuzzFastDecodeAgreesWithJSON holds it to that).

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// recordFields and overrideFields are the JSON names of Record and
// policy.Override in the order encoding/json writes them.
var (
	recordFields = [...]string{"revision", "parent", "kind", "author", "message", "time", "sha256", "document",
		"key", "scope", "override", "deleted", "restates", "refused_revision", "refused_sha256", "sig"}
	overrideFields = [...]string{"tier", "rate", "burst", "period", "quota", "quota_period", "expires", "reason", "store", "scope"}
)

// scanner reads the canonical encoding; every method reports false on
// anything else.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// plain reads a string of printable ASCII that encoding/json writes as
// is: no escapes, no '"', '\\', '<', '>' or '&'.
func (s *scanner) plain() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		c := s.b[s.i]
		if c == '"' {
			v := s.b[start:s.i]
			s.i++
			return v, true
		}
		if c < 0x20 || c > 0x7e || c == '\\' || c == '<' || c == '>' || c == '&' {
			return nil, false
		}
	}
	return nil, false
}

func (s *scanner) str() (string, bool) {
	v, ok := s.plain()
	return string(v), ok
}

// number is the next JSON number's text.
func (s *scanner) number() []byte {
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c >= '0' && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
			s.i++
		default:
			return s.b[start:s.i]
		}
	}
	return s.b[start:s.i]
}

// int64 reads an integer as strconv.FormatInt writes it.
func (s *scanner) int64() (int64, bool) {
	t := s.number()
	v, err := strconv.ParseInt(string(t), 10, 64)
	if err != nil || string(strconv.AppendInt(nil, v, 10)) != string(t) {
		return 0, false
	}
	return v, true
}

// float reads a float64 as encoding/json writes it (the 'f' format, in
// the range where encoding/json uses it).
func (s *scanner) float() (float64, bool) {
	t := s.number()
	v, err := strconv.ParseFloat(string(t), 64)
	if err != nil {
		return 0, false
	}
	if a := math.Abs(v); a != 0 && (a < 1e-6 || a >= 1e21) {
		return 0, false
	}
	var buf [32]byte
	if string(strconv.AppendFloat(buf[:0], v, 'f', -1, 64)) != string(t) {
		return 0, false
	}
	return v, true
}

// time reads a time as time.Time.MarshalJSON writes it, decoded by its
// UnmarshalJSON (what encoding/json calls).
func (s *scanner) time() (time.Time, bool) {
	start := s.i
	if _, ok := s.plain(); !ok {
		return time.Time{}, false
	}
	raw := s.b[start:s.i]
	var t time.Time
	if err := t.UnmarshalJSON(raw); err != nil {
		return time.Time{}, false
	}
	out, err := t.MarshalJSON()
	if err != nil || string(out) != string(raw) {
		return time.Time{}, false
	}
	return t, true
}

func (s *scanner) bool() (bool, bool) {
	switch {
	case strings.HasPrefix(string(s.b[s.i:]), "true"):
		s.i += 4
		return true, true
	case strings.HasPrefix(string(s.b[s.i:]), "false"):
		s.i += 5
		return false, true
	}
	return false, false
}

// fields reads an object's members, names in the order of names (each at
// most once), calling value for each with its index; value reports false
// to give up.
func (s *scanner) fields(names []string, value func(int) bool) bool {
	if !s.byte('{') {
		return false
	}
	next := 0
	for first := true; !s.byte('}'); first = false {
		if !first && !s.byte(',') {
			return false
		}
		name, ok := s.plain()
		if !ok || !s.byte(':') {
			return false
		}
		f := next
		for f < len(names) && names[f] != string(name) {
			f++
		}
		if f == len(names) || !value(f) {
			return false
		}
		next = f + 1
	}
	return true
}

// decodeOverride decodes an override record in the canonical encoding and
// checks its content hash; ok is false when it cannot vouch for the
// result (Decode then uses encoding/json).
func decodeOverride(value []byte) (Record, bool) {
	var buf [512]byte
	r, content, ok := parseOverride(value, buf[:0])
	if !ok {
		return Record{}, false
	}
	sum := sha256.Sum256(content)
	var hexSum [64]byte
	hex.Encode(hexSum[:], sum[:])
	if string(hexSum[:]) != r.SHA256 {
		return Record{}, false
	}
	return r, true
}

// parseOverride is decodeOverride before the hash: the record and its
// Content, appended to buf.
func parseOverride(value, buf []byte) (r Record, content []byte, ok bool) {
	s := &scanner{b: value}
	var ovStart, ovEnd int
	ok = s.fields(recordFields[:], func(f int) bool {
		var ok bool
		switch recordFields[f] {
		case "revision":
			r.Revision, ok = s.int64()
		case "parent":
			r.Parent, ok = s.int64()
		case "kind":
			var k []byte
			k, ok = s.plain()
			r.Kind = KindOverride
			ok = ok && string(k) == KindOverride
		case "author":
			r.Author, ok = s.str()
		case "message":
			r.Message, ok = s.str()
		case "time":
			r.Time, ok = s.time()
		case "sha256":
			r.SHA256, ok = s.str()
		case "key":
			r.Key, ok = s.str()
		case "scope":
			r.Scope, ok = s.str()
		case "override":
			ovStart = s.i
			r.Override, ok = s.override()
			ovEnd = s.i
		case "deleted":
			r.Deleted, ok = s.bool()
		case "restates":
			r.Restates, ok = s.bool()
		case "refused_revision":
			r.RefusedRevision, ok = s.int64()
		case "refused_sha256":
			r.RefusedSHA256, ok = s.str()
		case "sig":
			r.Sig, ok = s.str()
		}
		return ok
	})
	if !ok || s.i != len(value) || r.Kind != KindOverride || r.Key == "" {
		// (Kind is set only by a "kind" member, to KindOverride.)
		return Record{}, nil, false
	}
	// The content: [key, scope, the override's JSON or "deleted"], as
	// json.Marshal writes it; key and scope are plain, and the override's
	// JSON (canonical: read above) holds no character to escape but '"'.
	c := append(append(append(append(buf, `["`...), r.Key...), `","`...), r.Scope...)
	c = append(c, `","`...)
	if !r.Deleted && r.Override != nil {
		for _, ch := range value[ovStart:ovEnd] {
			if ch == '"' {
				c = append(c, '\\')
			}
			c = append(c, ch)
		}
	} else {
		c = append(c, "deleted"...)
	}
	return r, append(c, `"]`...), true
}

// override reads a policy.Override in the canonical encoding: what
// json.Marshal writes for the value read, byte for byte (every member it
// omits when empty is absent, not empty).
func (s *scanner) override() (*policy.Override, bool) {
	o := &policy.Override{}
	reason := false
	ok := s.fields(overrideFields[:], func(f int) bool {
		var ok bool
		switch overrideFields[f] {
		case "tier":
			o.Tier, ok = s.str()
			ok = ok && o.Tier != ""
		case "rate":
			o.Rate, ok = s.float()
			ok = ok && o.Rate != 0
		case "burst":
			o.Burst, ok = s.int64()
			ok = ok && o.Burst != 0
		case "period":
			o.Period, ok = s.str()
			ok = ok && o.Period != ""
		case "quota":
			o.Quota, ok = s.int64()
			ok = ok && o.Quota != 0
		case "quota_period":
			o.QuotaPeriod, ok = s.str()
			ok = ok && o.QuotaPeriod != ""
		case "expires":
			o.Expires, ok = s.time()
			ok = ok && !o.Expires.IsZero()
		case "reason":
			o.Reason, ok = s.str()
			reason = true
		case "store":
			o.Store, ok = s.str()
			ok = ok && o.Store != ""
		case "scope":
			o.Scope, ok = s.str()
			ok = ok && o.Scope != ""
		}
		return ok
	})
	return o, ok && reason
}
