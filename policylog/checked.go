package policylog

// A limiter reads the whole log at every start, and checking a signature
// costs far more than the rest of a record: on a log of a million signed
// records, a million checks. Checked is what a reader remembers of the
// checks it made, so that a start from its cache (POLICY_CACHE_DIR) makes
// again only the checks of what is new.
//
// What is remembered is a digest, per log offset, of the public key, the
// log key and the exact value whose signature held. On the next start a
// value at that offset is taken as checked only when its digest, computed
// with the key the keyring holds now for the record's key id, is the one
// remembered: the same bytes, under the same log key, signed by the same
// key. So the outcome is exactly that of checking the signature again
// (the keyring of this start still decides which keys are trusted, their
// identities and until=), and the file vouches for nothing an attacker
// could write: a different value, a log that started over, or a key
// replaced in the keyring all give another digest, and the signature is
// checked. The file is the reader's own, in its cache directory, which it
// already trusts to start from when Kafka is unreachable.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
)

// CheckedFile is the file of a reader's checked signatures in its cache
// directory.
const CheckedFile = "policy-log-checked.bin"

var checkedMagic = []byte("ratewarden policy-log checked v1\n")

type checkedEntry struct {
	off int64
	sum [16]byte
}

const checkedEntrySize = 8 + 16

// Checked is the signatures a reader checked, by offset.
type Checked struct {
	entries []checkedEntry // in offset order
}

func checkedSum(pub ed25519.PublicKey, key string, value []byte) [16]byte {
	h := sha256.New()
	h.Write(pub)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(key)))
	h.Write(n[:])
	h.Write([]byte(key))
	h.Write(value)
	var s [16]byte
	copy(s[:], h.Sum(nil))
	return s
}

// vouches reports whether the value at off with digest sum was checked.
func (c *Checked) vouches(off int64, sum [16]byte) bool {
	if c == nil {
		return false
	}
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].off >= off })
	return i < len(c.entries) && c.entries[i].off == off && c.entries[i].sum == sum
}

// Len is the number of checks remembered.
func (c *Checked) Len() int {
	if c == nil {
		return 0
	}
	return len(c.entries)
}

// LoadChecked reads the file at path.
func LoadChecked(path string) (*Checked, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(b, checkedMagic) || (len(b)-len(checkedMagic))%checkedEntrySize != 0 {
		return nil, fmt.Errorf("%s: not a file of checked signatures", path)
	}
	b = b[len(checkedMagic):]
	c := &Checked{entries: make([]checkedEntry, len(b)/checkedEntrySize)}
	for i := range c.entries {
		e := b[i*checkedEntrySize:]
		c.entries[i].off = int64(binary.LittleEndian.Uint64(e))
		copy(c.entries[i].sum[:], e[8:checkedEntrySize])
		if i > 0 && c.entries[i].off <= c.entries[i-1].off {
			return nil, fmt.Errorf("%s: offsets out of order", path)
		}
	}
	return c, nil
}

// Save writes c to path atomically.
func (c *Checked) Save(path string) error {
	b := make([]byte, 0, len(checkedMagic)+len(c.entries)*checkedEntrySize)
	b = append(b, checkedMagic...)
	for _, e := range c.entries {
		b = binary.LittleEndian.AppendUint64(b, uint64(e.off))
		b = append(b, e.sum[:]...)
	}
	return writeFileAtomic(path, b)
}
