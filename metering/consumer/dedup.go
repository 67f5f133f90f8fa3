package consumer

import "hash/maphash"

// Deduplication: a message is a duplicate when the same event id is stored
// at an earlier position of its partition (a producer retry, a spool resent
// after an outage, a replayed range). The rule depends only on the
// partition's contents, never on when the consumer restarted, so a replay
// decides every message the same way. Two tiers answer it, both exactly:
//
//   - Memory (dedup below) holds the ids of the last `window` positions.
//     It also knows `older`, an upper bound of the decision time (ts) of
//     every event at a position it does not hold. A duplicate carries its
//     original's ts, so a message with ts > older can only have its
//     original in memory: memory decides it. That is every message of a
//     healthy stream, whose decision times grow with its positions.
//   - A message that memory does not hold and whose ts is at or below
//     older (a late message: its original could lie further back) is
//     looked up in event_ids (chsink.LateIDs) before its batch is written:
//     the window there reaches as far back as event_ids is kept.
//
// The window is at least two batches, so a position memory forgets is
// always in ClickHouse already when a late message is looked up.
//
// Ids are kept in memory as 64-bit hashes (seeded per process): a false
// duplicate needs a collision within one window, about window/2^64 per
// event; event_ids compares the ids themselves.
type dedup struct {
	seed   maphash.Seed
	window int64
	seen   map[uint64]int64 // hash → position of the first occurrence
	ring   []entry          // in position order, for eviction
	head   int
	older  int64 // ts bound of every first occurrence not in memory
}

type entry struct {
	h   uint64
	off int64
	ts  int64
}

func newDedup(seed maphash.Seed, window int64) *dedup {
	return &dedup{seed: seed, window: window, seen: make(map[uint64]int64, min(window, 1<<20))}
}

// verdict is what memory says about a message.
type verdict int

const (
	fresh     verdict = iota // not a duplicate: its original, if any, would be in memory
	duplicate                // a duplicate of an earlier position in memory
	late                     // not in memory and possibly older: look it up in event_ids
)

// add decides the message of id at offset (decision time ts) from memory
// and, unless it is a duplicate, records it as a first occurrence. Offsets
// must not decrease.
func (d *dedup) add(id string, offset, ts int64) verdict {
	// Forget (and bound) what left the window first: an original just
	// outside it must count in older before this message is judged.
	d.evict(offset)
	h := maphash.String(d.seed, id)
	if first, ok := d.seen[h]; ok {
		if first == offset {
			return fresh // the same message again (loaded from ClickHouse)
		}
		if first < offset && first >= offset-d.window {
			return duplicate
		}
	}
	v := fresh
	if ts <= d.older {
		v = late
	}
	d.seen[h] = offset
	d.ring = append(d.ring, entry{h, offset, ts})
	return v
}

// bound raises older to at least ts (what ClickHouse holds below the
// positions loaded into memory).
func (d *dedup) bound(ts int64) { d.older = max(d.older, ts) }

// newest is the highest ts held in memory, 0 when empty.
func (d *dedup) newest() int64 {
	var m int64
	for _, e := range d.ring[d.head:] {
		m = max(m, e.ts)
	}
	return m
}

// evict forgets entries older than the window, raising older to their ts.
func (d *dedup) evict(now int64) {
	for d.head < len(d.ring) && d.ring[d.head].off < now-d.window {
		e := d.ring[d.head]
		if d.seen[e.h] == e.off {
			delete(d.seen, e.h)
		}
		d.older = max(d.older, e.ts)
		d.head++
	}
	if d.head > 4096 && d.head*2 > len(d.ring) {
		d.ring = append(d.ring[:0], d.ring[d.head:]...)
		d.head = 0
	}
}
