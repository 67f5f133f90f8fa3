package policylog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ratewarden/ratewarden/policy"
)

// The policy cache (POLICY_CACHE_DIR): the Follower writes the policy in
// force to it after each revision it applies; a limiter that starts while
// the log is unreachable enforces it (ReadCache), and a restore can start
// from a limiter's copy (CacheState).

// CacheFile is the cache's file name in POLICY_CACHE_DIR.
const CacheFile = "policy-log-cache.json"

type cacheBody struct {
	Topic     string           `json:"topic"`
	Head      int64            `json:"head"`
	Epoch     int64            `json:"epoch,omitempty"`
	Document  Record           `json:"document"`
	Overrides []cachedOverride `json:"overrides"`
}

type cachedOverride struct {
	Key      string          `json:"key"`
	Scope    string          `json:"scope,omitempty"`
	Override policy.Override `json:"override"`
}

// writeCache writes the policy in force (the document's record and the
// compiled overrides) to CacheDir, atomically: a temporary file, synced,
// then renamed.
func (f *Follower) writeCache() {
	if f.cfg.CacheDir == "" {
		return
	}
	st := f.client.State()
	_, doc := st.Document()
	b, err := cacheJSON(cacheBody{Topic: f.cfg.Topic, Head: st.Head(), Epoch: st.Epoch(), Document: doc}, st)
	if err == nil {
		err = writeFileAtomic(filepath.Join(f.cfg.CacheDir, CacheFile), b...)
	}
	if err == nil && f.cfg.Keys != nil {
		err = f.client.Checked().Save(filepath.Join(f.cfg.CacheDir, CheckedFile))
	}
	if err != nil {
		f.cfg.Logger.Error("policy cache: cannot write; a start while the log is unreachable will use POLICY_FILE", "dir", f.cfg.CacheDir, "err", err)
	}
}

// cacheJSON is json.Marshal(body) with body.Overrides the overrides of
// st, in pieces to write one after the other: each part of the overrides
// (policy.Overrides.EachTaggedPart, in the order EachOverride walks them)
// is encoded on its own CPU.
func cacheJSON(body cacheBody, st *State) ([][]byte, error) {
	parts := make([][]byte, overrideParts(st.Overrides()))
	errs := make([]error, len(parts))
	inParts(len(parts), func(part int) {
		b := []byte{'['}
		st.ov.EachTaggedPart(part, len(parts), func(k policy.OverrideKey, o policy.Override, _ policy.OverrideTag) {
			if errs[part] != nil {
				return
			}
			if len(b) > 1 {
				b = append(b, ',')
			}
			o.Reason = "cached"
			b, errs[part] = appendCachedOverride(b, &cachedOverride{Key: k.Key, Scope: k.Scope, Override: o})
		})
		parts[part] = append(b, ']')
	})
	body.Overrides = []cachedOverride{}
	head, err := json.Marshal(body)
	if err = errors.Join(append(errs, err)...); err != nil {
		return nil, err
	}
	// head ends with the empty array of overrides, its last member: the
	// parts' elements go between its brackets.
	const tail = `[]}`
	if !bytes.HasSuffix(head, []byte(tail)) {
		return nil, fmt.Errorf("policy cache: unexpected encoding %.40q", head[max(0, len(head)-40):])
	}
	out := [][]byte{head[:len(head)-len(tail)+1]}
	for _, p := range parts {
		if p = p[1 : len(p)-1]; len(p) > 0 {
			if len(out) > 1 {
				out = append(out, []byte(","))
			}
			out = append(out, p)
		}
	}
	return append(out, []byte(tail[1:])), nil
}

// appendCachedOverride appends c as json.Marshal encodes it: written
// here for what a cache holds (plain strings, a rate in the range
// encoding/json writes without an exponent), through json.Marshal for
// anything else.
func appendCachedOverride(b []byte, c *cachedOverride) ([]byte, error) {
	o := &c.Override
	plain := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if ch := s[i]; ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\' || ch == '<' || ch == '>' || ch == '&' {
				return false
			}
		}
		return true
	}
	if a := math.Abs(o.Rate); (a != 0 && (a < 1e-6 || a >= 1e21)) || !o.Expires.IsZero() ||
		!plain(c.Key) || !plain(c.Scope) || !plain(o.Tier) || !plain(o.Period) || !plain(o.QuotaPeriod) ||
		!plain(o.Reason) || !plain(o.Store) || !plain(o.Scope) {
		j, err := json.Marshal(c)
		return append(b, j...), err
	}
	str := func(name, v string, omitEmpty bool) {
		if v != "" || !omitEmpty {
			b = append(append(append(append(b, `,"`...), name...), `":"`...), v...)
			b = append(b, '"')
		}
	}
	b = append(append(b, `{"key":"`...), c.Key...)
	b = append(b, '"')
	str("scope", c.Scope, true)
	b = append(b, `,"override":{`...)
	start := len(b)
	str("tier", o.Tier, true)
	if o.Rate != 0 {
		b = strconv.AppendFloat(append(b, `,"rate":`...), o.Rate, 'f', -1, 64)
	}
	if o.Burst != 0 {
		b = strconv.AppendInt(append(b, `,"burst":`...), o.Burst, 10)
	}
	str("period", o.Period, true)
	if o.Quota != 0 {
		b = strconv.AppendInt(append(b, `,"quota":`...), o.Quota, 10)
	}
	str("quota_period", o.QuotaPeriod, true)
	str("reason", o.Reason, false)
	str("store", o.Store, true)
	str("scope", o.Scope, true)
	b = append(b[:start], b[start+1:]...) // the first member's comma
	return append(b, "}}"...), nil
}

// writeFileAtomic writes the concatenation of parts to path atomically.
func writeFileAtomic(path string, parts ...[]byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a rename there is nothing left to remove
	for _, b := range parts {
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func readCacheBody(dir, topic string) (cacheBody, *policy.Policy, error) {
	var c cacheBody
	if dir == "" {
		return c, nil, errors.New("POLICY_CACHE_DIR is not set")
	}
	b, err := os.ReadFile(filepath.Join(dir, CacheFile))
	if err != nil {
		return c, nil, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, nil, fmt.Errorf("policy cache: %w", err)
	}
	if c.Topic != topic {
		return c, nil, fmt.Errorf("policy cache is of topic %q, not %q", c.Topic, topic)
	}
	v, err := c.Document.Encode()
	if err != nil {
		return c, nil, err
	}
	if _, err := Decode(DocumentKey, v); err != nil || c.Head < 1 {
		return c, nil, fmt.Errorf("policy cache: the document: %v (head %d)", err, c.Head)
	}
	doc, err := policy.Parse([]byte(c.Document.Document))
	if err != nil {
		return c, nil, fmt.Errorf("policy cache: the document: %w", err)
	}
	return c, doc, nil
}

// CacheState is the state a limiter's cache file in dir (of topic)
// holds, as a State that keeps content (for Client.Restore): the
// document's record, and each override as compiled (a record of the
// cache's head, whose reason says where it came from: a cache keeps no
// reasons). Its digest is the digest the limiter enforced.
func CacheState(dir, topic string) (*State, error) {
	c, doc, err := readCacheBody(dir, topic)
	if err != nil {
		return nil, err
	}
	st := NewState(true)
	st.doc, st.docRec, st.head, st.epoch = doc, c.Document, c.Head, c.Epoch
	for _, o := range c.Overrides {
		ov := o.Override
		ov.Reason = "restored from a limiter's policy cache"
		if err := ov.Validate(doc); err != nil {
			return nil, fmt.Errorf("policy cache: override of %q: %w", o.Key, err)
		}
		rec := Record{Revision: c.Head, Parent: c.Head - 1, Kind: KindOverride, Key: o.Key, Scope: o.Scope, Override: &ov,
			Author: c.Document.Author, Message: "restored from a limiter's policy cache", Time: c.Document.Time}
		rec.Seal()
		st.install(rec)
	}
	return st, nil
}

// ReadCache rebuilds the policy in force from the cache file in dir, of
// topic: the document (its hash checked) and every override (validated
// against it).
func ReadCache(dir, topic string) (*policy.WithOverrides, Info, error) {
	c, doc, err := readCacheBody(dir, topic)
	if err != nil {
		return nil, Info{}, err
	}
	ov := policy.NewOverrides(len(c.Overrides))
	for _, o := range c.Overrides {
		if err := o.Override.Validate(doc); err != nil {
			return nil, Info{}, fmt.Errorf("policy cache: override of %q: %w", o.Key, err)
		}
		ov.Put(policy.OverrideKey{Key: o.Key, Scope: o.Scope}, o.Override)
	}
	info := Info{Version: doc.Version(), Hash: doc.Hash(), Revision: c.Head, Source: SourceCache, Overrides: ov.Len(), Author: c.Document.Author,
		Epoch: c.Epoch, Digest: StateDigest(doc, ov), Status: StatusOK}
	return policy.NewWithOverrides(doc, ov, nil), info, nil
}
