package consumer

import "hash/maphash"

// dedup remembers the event ids of the last `window` offsets of one
// partition. An event is a duplicate when the same id was seen at an
// earlier offset no more than window offsets before it: the rule depends
// only on the partition's contents, not on when the consumer restarted,
// so a replay decides every message the same way.
//
// Ids are kept as 64-bit hashes (seeded per process): a false duplicate
// needs a collision within one window, about window/2^64 per event.
type dedup struct {
	seed   maphash.Seed
	window int64
	seen   map[uint64]int64 // hash → offset of the first occurrence
	ring   []entry          // in offset order, for eviction
	head   int
}

type entry struct {
	h   uint64
	off int64
}

func newDedup(seed maphash.Seed, window int64) *dedup {
	return &dedup{seed: seed, window: window, seen: make(map[uint64]int64, min(window, 1<<20))}
}

// add records id at offset and reports whether it is a duplicate of an
// earlier offset within the window. Offsets must not decrease.
func (d *dedup) add(id string, offset int64) (duplicate bool) {
	h := maphash.String(d.seed, id)
	if first, ok := d.seen[h]; ok && first != offset && first < offset && first >= offset-d.window {
		return true
	} else if ok && first == offset {
		return false // the same message again (replay after a restart)
	}
	d.seen[h] = offset
	d.ring = append(d.ring, entry{h, offset})
	d.evict(offset)
	return false
}

// evict forgets entries older than the window (memory only; add checks
// the window itself).
func (d *dedup) evict(now int64) {
	for d.head < len(d.ring) && d.ring[d.head].off < now-d.window {
		e := d.ring[d.head]
		if d.seen[e.h] == e.off {
			delete(d.seen, e.h)
		}
		d.head++
	}
	if d.head > 4096 && d.head*2 > len(d.ring) {
		d.ring = append(d.ring[:0], d.ring[d.head:]...)
		d.head = 0
	}
}
