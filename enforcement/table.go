package enforcement

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// Design: a fixed number of shards, each an open-addressing hash table
// (linear probing) whose writers take the shard's mutex and whose readers
// take no lock at all. An entry, once created, is mutated under its own
// lock by its user, never under the shard lock. Memory is bounded twice:
// idle entries are swept (see sweep), and a shard at its cap evicts an
// arbitrary entry before inserting, which for a rate limiter only means
// that entry restarts full — the same thing an idle entry would do.
//
// The table is its own rather than a map per shard because a lookup is on
// the local tier's rejection path, where a flood is answered:
// the maps hashed the key twice (once to pick the shard, once inside the
// map with the scope) and every lookup wrote the shard's RWMutex reader
// count, a cache line that the cores deciding for one flooded key fought
// over. Here the key's one hash picks the shard (its top bits) and the slot
// (its low bits); the scopes of one key, which are few, sit in neighbouring
// slots.
//
// Lock-free reads are safe because a slot only ever holds a pointer to an
// immutable node (its hash and id never change after it is published), and
// slots and slot arrays are read and written atomically. A reader racing a
// writer can only miss an entry (one being moved back by a deletion, or
// inserted into a newer slot array); a miss is confirmed under the mutex
// before anything is inserted, so a miss never creates a second entry for
// an id. A reader can also find an entry that is being removed, which is
// the same as having looked it up just before the removal.

const (
	tableShardBits = 6
	tableShards    = 1 << tableShardBits
	minShardSlots  = 8 // a power of two
)

type bucketID struct{ key, scope string }

// node is one entry with its identity; hash and id never change.
type node[T any] struct {
	hash uint64
	id   bucketID
	val  T
}

// slots is one generation of a shard's array; len is a power of two.
type slots[T any] []atomic.Pointer[node[T]]

type shard[T any] struct {
	slots atomic.Pointer[slots[T]] // at most 3/4 full
	mu    sync.Mutex               // writers
	n     int                      // entries; under mu
	evict int                      // where the next eviction starts looking; under mu
}

type table[T any] struct {
	seed     maphash.Seed
	maxShard int
	shards   [tableShards]shard[T]
}

func newTable[T any](maxEntries int) *table[T] {
	if maxEntries < tableShards {
		maxEntries = tableShards
	}
	t := &table[T]{seed: maphash.MakeSeed(), maxShard: maxEntries / tableShards}
	for i := range t.shards {
		s := make(slots[T], minShardSlots)
		t.shards[i].slots.Store(&s)
	}
	return t
}

// find returns the node for (h, id) in ss and the index of its slot, or
// nil and the index of the free slot where the probe ended.
func (ss slots[T]) find(h uint64, id bucketID) (*node[T], int) {
	mask := len(ss) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		n := ss[i].Load()
		if n == nil || n.hash == h && n.id == id {
			return n, i
		}
	}
}

// get returns the entry for id, creating it with init when missing.
func (t *table[T]) get(id bucketID, init func(*T)) *T {
	h := maphash.String(t.seed, id.key)
	s := &t.shards[h>>(64-tableShardBits)]
	if n, _ := (*s.slots.Load()).find(h, id); n != nil {
		return &n.val
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, _ := (*s.slots.Load()).find(h, id); n != nil {
		return &n.val
	}
	if s.n >= t.maxShard {
		s.evictOne()
	}
	ss := *s.slots.Load()
	if (s.n+1)*4 > len(ss)*3 {
		ss = s.grow(ss)
	}
	n := &node[T]{hash: h, id: id}
	if init != nil {
		init(&n.val)
	}
	_, i := ss.find(h, id)
	ss[i].Store(n)
	s.n++
	return &n.val
}

// grow publishes a copy of ss with twice the slots. Called under s.mu.
func (s *shard[T]) grow(ss slots[T]) slots[T] {
	bigger := make(slots[T], 2*len(ss))
	for i := range ss {
		if n := ss[i].Load(); n != nil {
			_, j := bigger.find(n.hash, n.id)
			bigger[j].Store(n)
		}
	}
	s.slots.Store(&bigger)
	return bigger
}

// evictOne removes an arbitrary entry, the next one after the last victim.
// Called under s.mu with s.n > 0.
func (s *shard[T]) evictOne() {
	ss := *s.slots.Load()
	mask := len(ss) - 1
	for i := s.evict & mask; ; i = (i + 1) & mask {
		if ss[i].Load() != nil {
			s.deleteAt(ss, i)
			s.evict = i + 1
			return
		}
	}
}

// deleteAt frees slot i and moves back the entries after it whose probe
// passed through it, so that every probe still finds its entry (backward
// shift deletion: no tombstones). Called under s.mu.
func (s *shard[T]) deleteAt(ss slots[T], i int) {
	mask := len(ss) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		n := ss[j].Load()
		if n == nil {
			break
		}
		home := int(n.hash) & mask
		// The entry at j may move to i only if its home is not in the
		// cyclic range (i, j]: its probe started at or before i.
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			ss[i].Store(n)
			i = j
		}
	}
	ss[i].Store(nil)
	s.n--
}

// sweep removes every entry for which idle returns true. idle is called
// under the shard's mutex and must not block.
func (t *table[T]) sweep(idle func(*T) bool) (removed int) {
	for si := range t.shards {
		s := &t.shards[si]
		s.mu.Lock()
		ss := *s.slots.Load()
		for i := 0; i < len(ss); {
			if n := ss[i].Load(); n != nil && idle(&n.val) {
				// Another entry may have moved into i: look at i again.
				// (One that wraps round from the start may be asked twice;
				// idle is only a question.)
				s.deleteAt(ss, i)
				removed++
				continue
			}
			i++
		}
		s.mu.Unlock()
	}
	return removed
}

// len counts the entries (for metrics and tests).
func (t *table[T]) len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}
