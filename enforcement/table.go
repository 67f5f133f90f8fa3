package enforcement

import (
	"hash/maphash"
	"sync"
)

// Design: a fixed number of shards, each a map behind its own RWMutex, so
// that goroutines deciding for different keys rarely meet. Lookups take the
// read lock only; an entry, once created, is mutated under its own lock by
// its user, never under the shard lock. Memory is bounded twice: idle entries
// are swept (see sweep), and a shard at its cap evicts an arbitrary entry
// before inserting, which for a rate limiter only means that entry restarts
// full — the same thing an idle entry would do.

const tableShards = 64

type bucketID struct{ key, scope string }

type shard[T any] struct {
	mu sync.RWMutex
	m  map[bucketID]*T
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
		t.shards[i].m = make(map[bucketID]*T)
	}
	return t
}

func (t *table[T]) shardOf(id bucketID) *shard[T] {
	// The key alone picks the shard: one hash instead of two, and scopes of
	// one key are few.
	return &t.shards[maphash.String(t.seed, id.key)%tableShards]
}

// get returns the entry for id, creating it with init when missing.
func (t *table[T]) get(id bucketID, init func(*T)) *T {
	s := t.shardOf(id)
	s.mu.RLock()
	e := s.m[id]
	s.mu.RUnlock()
	if e != nil {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e = s.m[id]; e != nil {
		return e
	}
	if len(s.m) >= t.maxShard {
		for k := range s.m { // map order is random: an arbitrary victim
			delete(s.m, k)
			break
		}
	}
	e = new(T)
	if init != nil {
		init(e)
	}
	s.m[id] = e
	return e
}

// sweep removes every entry for which idle returns true. idle is called
// under the shard's write lock and must not block.
func (t *table[T]) sweep(idle func(*T) bool) (removed int) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if idle(e) {
				delete(s.m, k)
				removed++
			}
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
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}
