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
// Memory is generations of ids, each the messages of span consecutive
// positions: a new generation starts when a message lies past the current
// one's span, and the oldest is then forgotten whole (its positions all
// lie more than window behind), so memory holds at least the last window
// positions and at most window + span. Each generation knows the newest
// decision time it holds: a message newer than that cannot be a copy of
// anything in it, so a healthy stream, whose messages are newer than every
// older generation's, costs one lookup (in the current generation) and no
// per-message eviction. A generation holds at most maxSpan ids: the
// current one, where every message is looked up and recorded, then fits
// in a core's cache (a few hundred KiB), where a window's worth would
// miss it on nearly every message.
//
// Ids are kept in memory as 64-bit hashes (seeded per process): a false
// duplicate needs a collision within memory, about 1.5·window/2^64 per
// event; event_ids compares the ids themselves.
type dedup struct {
	seed   maphash.Seed
	span   int64    // positions per generation
	gens   []*idGen // gens[0] the current one, then older; nil until used
	older  int64    // ts bound of every first occurrence not in memory
	prevTS int64    // the newest ts of the generations but the current one
}

// maxSpan bounds the positions of a generation.
const maxSpan = 1 << 14

// idGen is one generation: hash → position of the first occurrence.
type idGen struct {
	ids   map[uint64]int64
	start int64 // its first position
	maxTS int64 // the newest decision time it holds
}

// newDedup remembers at least the last window positions: generations of
// half the window (at most maxSpan), one more than the window needs.
func newDedup(seed maphash.Seed, window int64) *dedup {
	span := min(max((window+1)/2, 1), maxSpan)
	return &dedup{seed: seed, span: span, gens: make([]*idGen, (window+span-1)/span+1)}
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
	d.advance(offset)
	h := maphash.String(d.seed, id)
	gens := d.gens
	if ts > d.prevTS {
		gens = gens[:1] // newer than every older generation
	}
	for _, g := range gens {
		if g == nil || ts > g.maxTS {
			continue // a copy carries its original's ts: not in g
		}
		if first, ok := g.ids[h]; ok {
			if first == offset {
				return fresh // the same message again (loaded from ClickHouse)
			}
			return duplicate
		}
	}
	v := fresh
	if ts <= d.older {
		v = late
	}
	cur := d.gens[0]
	cur.ids[h] = offset
	cur.maxTS = max(cur.maxTS, ts)
	return v
}

// advance starts a new generation when offset lies past the current one's
// span, forgetting the oldest and raising older to its newest ts.
func (d *dedup) advance(offset int64) {
	if cur := d.gens[0]; cur != nil && offset < cur.start+d.span {
		return
	}
	last := len(d.gens) - 1
	g := d.gens[last]
	if g != nil {
		d.older = max(d.older, g.maxTS)
		clear(g.ids) // keeps its room for the next generation
		g.maxTS = 0
	} else {
		g = &idGen{ids: make(map[uint64]int64, d.span)}
	}
	g.start = offset
	copy(d.gens[1:], d.gens[:last])
	d.gens[0] = g
	d.prevTS = 0
	for _, o := range d.gens[1:] {
		if o != nil {
			d.prevTS = max(d.prevTS, o.maxTS)
		}
	}
}

// bound raises older to at least ts (what ClickHouse holds below the
// positions loaded into memory).
func (d *dedup) bound(ts int64) { d.older = max(d.older, ts) }

// newest is the highest ts held in memory, 0 when empty.
func (d *dedup) newest() int64 {
	var m int64
	for _, g := range d.gens {
		if g != nil {
			m = max(m, g.maxTS)
		}
	}
	return m
}
