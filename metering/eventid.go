package metering

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync/atomic"
	"time"
)

// IDs makes event ids: 28 hex digits, of which 12 are milliseconds since the
// epoch, 8 a random per-process prefix and 8 a counter. They are unique
// across processes (the prefix) and within one (the counter wraps only after
// 2^32 ids, never within one millisecond), and sort by time. Safe for
// concurrent use; one atomic add per id.
type IDs struct {
	prefix [4]byte
	n      atomic.Uint32
}

// NewIDs returns a generator with a fresh random prefix.
func NewIDs() *IDs {
	g := &IDs{}
	_, _ = rand.Read(g.prefix[:])
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	g.n.Store(binary.BigEndian.Uint32(seed[:]))
	return g
}

// Next returns the id of an event decided at t.
func (g *IDs) Next(t time.Time) string {
	var raw [14]byte
	ms := uint64(t.UnixMilli())
	raw[0], raw[1], raw[2], raw[3], raw[4], raw[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	copy(raw[6:10], g.prefix[:])
	binary.BigEndian.PutUint32(raw[10:], g.n.Add(1))
	return hex.EncodeToString(raw[:])
}
