package enforcement

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Design: a fixed number of shards, each an open-addressing hash table
// (linear probing) whose writers take the shard's mutex and whose readers
// take no lock at all. An entry, once created, is mutated under its own
// lock by its user, never under the shard lock.
//
// Memory is bounded in entries and in bytes, both per shard: idle entries
// are swept (see sweep), and a shard that has no room for a new entry
// evicts one first (evictOne). The bytes counted are what the allocator
// hands out for each node and its identity string (rounded up to the
// allocator's size classes), the shard's slot array, and whatever the
// owner adds for state it keeps beside its entries (extra). Eviction asks
// the owner to rank a sample of entries (rank): it prefers what would
// restart in the same state anyway, and never removes an entry the owner
// says protects; a shard with nothing it may evict does not insert, and
// get hands back an entry that is not kept (tracked false). Which entry a
// shard evicts is a rate limiter's choice, not a cache's: losing an entry
// makes it restart full.
//
// The table is its own rather than a map per shard because a lookup is on
// the local tier's rejection path, where a flood is answered: maps hashed
// the key twice (once to pick the shard, once inside the map with the
// scope) and every lookup wrote the shard's RWMutex reader count, a cache
// line that the cores deciding for one flooded key fought over. Here the
// key's one hash picks the shard (its top bits) and the slot (its low
// bits); the scopes of one key, which are few, sit in neighbouring slots.
//
// A node keeps its identity in one string of its own, key then scope, and
// the key's length: one allocation sized exactly, and never a reference
// into a caller's buffer (which would keep the whole buffer alive).
//
// Lock-free reads are safe because a slot only ever holds a pointer to an
// immutable node (its hash and identity never change after it is
// published), and slots and slot arrays are read and written atomically. A
// reader racing a writer can only miss an entry (one being moved back by a
// deletion, or inserted into a newer slot array); a miss is confirmed under
// the mutex before anything is inserted, so a miss never creates a second
// entry for an id. A reader can also find an entry that is being removed,
// which is the same as having looked it up just before the removal.

const (
	tableShardBits = 6
	tableShards    = 1 << tableShardBits
	minShardSlots  = 8 // a power of two
	// evictSample is how many entries a shard ranks to choose one victim:
	// the sampled approximation of "the best candidate" that keeps an
	// insertion's cost bounded however the shard is filled.
	evictSample = 16
	// maxEvictions bounds the victims one insertion may take (entries
	// differ in size, and a growing slot array needs room too).
	maxEvictions = 4
)

type bucketID struct{ key, scope string }

// node is one entry with its identity; h, kl and s never change.
type node[T any] struct {
	h   uint32 // the low bits of the key's hash: the home slot
	kl  uint32 // len(key) in s
	s   string // key + scope
	val T
}

func (n *node[T]) is(id bucketID) bool {
	return int(n.kl) == len(id.key) && len(n.s) == len(id.key)+len(id.scope) &&
		n.s[:n.kl] == id.key && n.s[n.kl:] == id.scope
}

// slots is one generation of a shard's array; len is a power of two.
type slots[T any] []atomic.Pointer[node[T]]

type shard[T any] struct {
	slots atomic.Pointer[slots[T]] // at most 3/4 full
	mu    sync.Mutex               // writers
	n     int                      // entries; under mu
	bytes int64                    // nodes, their strings and the slot array; under mu
	evict int                      // where the next eviction starts looking; under mu
}

// tableConfig is what a table's owner tells it about its entries. The zero
// value of each field is a documented default.
type tableConfig[T any] struct {
	maxEntries int   // in the whole table (at least tableShards)
	maxBytes   int64 // in the whole table; 0 = no bound in bytes
	// rank, when set, orders eviction candidates: lower goes first, and ok
	// false means the entry protects and is never evicted. It is called
	// under the shard's mutex, with now as given to get, and must not
	// block. nil: any entry, in slot order.
	rank func(v *T, now int64) (score uint64, ok bool)
	// removed, when set, is called under the shard's mutex for every entry
	// the table drops (evicted or swept), after it is unpublished.
	removed func(v *T)
}

type table[T any] struct {
	seed          maphash.Seed
	maxShard      int
	maxShardBytes int64
	nodeBytes     int64 // the allocator's size for one node[T]
	rank          func(*T, int64) (uint64, bool)
	removed       func(*T)
	// extra is bytes the owner holds beside its entries (state allocated
	// only for some of them), counted in the bound; the owner adds and
	// subtracts it.
	extra     atomic.Int64
	evictions atomic.Uint64 // entries evicted to make room
	untracked atomic.Uint64 // insertions refused: nothing evictable
	shards    [tableShards]shard[T]
}

func newTable[T any](cfg tableConfig[T]) *table[T] {
	maxEntries := max(cfg.maxEntries, tableShards)
	t := &table[T]{
		seed:          maphash.MakeSeed(),
		maxShard:      maxEntries / tableShards,
		maxShardBytes: cfg.maxBytes / tableShards,
		nodeBytes:     allocSize(int(unsafe.Sizeof(node[T]{}))),
		rank:          cfg.rank,
		removed:       cfg.removed,
	}
	if cfg.maxBytes <= 0 {
		t.maxShardBytes = 1 << 62
	}
	for i := range t.shards {
		s := make(slots[T], minShardSlots)
		t.shards[i].slots.Store(&s)
		t.shards[i].bytes = minShardSlots * 8
	}
	return t
}

// find returns the node for (h, id) in ss and the index of its slot, or
// nil and the index of the free slot where the probe ended.
func (ss slots[T]) find(h uint32, id bucketID) (*node[T], int) {
	mask := len(ss) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		n := ss[i].Load()
		if n == nil || n.h == h && n.is(id) {
			return n, i
		}
	}
}

// get returns the entry for id, creating it with init when missing. now is
// passed to rank when room must be made. tracked is false when the shard
// had no room and nothing it could evict: the entry returned is new and
// kept nowhere.
func (t *table[T]) get(id bucketID, now int64, init func(*T)) (v *T, tracked bool) {
	h64 := maphash.String(t.seed, id.key)
	h := uint32(h64)
	s := &t.shards[h64>>(64-tableShardBits)]
	if n, _ := (*s.slots.Load()).find(h, id); n != nil {
		return &n.val, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, _ := (*s.slots.Load()).find(h, id); n != nil {
		return &n.val, true
	}
	size := t.nodeBytes + allocSize(len(id.key)+len(id.scope))
	for evicted := 0; ; evicted++ {
		need := size
		if ss := *s.slots.Load(); (s.n+1)*4 > len(ss)*3 {
			need += int64(len(ss)) * 8 // the doubled array
		}
		if s.n < t.maxShard && s.bytes+need+t.extra.Load()/tableShards <= t.maxShardBytes {
			break
		}
		if evicted == maxEvictions || s.n == 0 || !t.evictOne(s, now) {
			t.untracked.Add(1)
			v := new(T)
			if init != nil {
				init(v)
			}
			return v, false
		}
	}
	ss := *s.slots.Load()
	if (s.n+1)*4 > len(ss)*3 {
		ss = s.grow(ss)
	}
	n := &node[T]{h: h, kl: uint32(len(id.key)), s: joinID(id)}
	if init != nil {
		init(&n.val)
	}
	_, i := ss.find(h, id)
	ss[i].Store(n)
	s.n++
	s.bytes += size
	return &n.val, true
}

// lookup returns the entry for id when the table holds it, creating nothing.
func (t *table[T]) lookup(id bucketID) (*T, bool) {
	h64 := maphash.String(t.seed, id.key)
	s := &t.shards[h64>>(64-tableShardBits)]
	if n, _ := (*s.slots.Load()).find(uint32(h64), id); n != nil {
		return &n.val, true
	}
	return nil, false
}

// joinID is key + scope in a string of its own: concatenation copies,
// except that with one side empty it may return the other side itself.
func joinID(id bucketID) string {
	if id.key == "" || id.scope == "" {
		return string([]byte(id.key + id.scope))
	}
	return id.key + id.scope
}

// grow publishes a copy of ss with twice the slots. Called under s.mu.
func (s *shard[T]) grow(ss slots[T]) slots[T] {
	bigger := make(slots[T], 2*len(ss))
	mask := len(bigger) - 1
	for i := range ss {
		if n := ss[i].Load(); n != nil {
			j := int(n.h) & mask
			for bigger[j].Load() != nil {
				j = (j + 1) & mask
			}
			bigger[j].Store(n)
		}
	}
	s.slots.Store(&bigger)
	s.bytes += int64(len(ss)) * 8
	return bigger
}

// evictOne removes the lowest-ranked evictable entry of a sample of
// evictSample entries from the eviction cursor on, and reports whether it
// removed one. Called under s.mu with s.n > 0.
func (t *table[T]) evictOne(s *shard[T], now int64) bool {
	ss := *s.slots.Load()
	mask := len(ss) - 1
	victim, best := -1, uint64(0)
	i := s.evict & mask
	for seen := 0; seen < min(evictSample, s.n); i = (i + 1) & mask {
		n := ss[i].Load()
		if n == nil {
			continue
		}
		seen++
		if t.rank == nil {
			victim = i
			break
		}
		if score, ok := t.rank(&n.val, now); ok && (victim < 0 || score < best) {
			victim, best = i, score
		}
	}
	s.evict = i + 1
	if victim < 0 {
		return false
	}
	t.drop(s, ss, victim)
	t.evictions.Add(1)
	return true
}

// drop removes the entry at slot i and accounts for it. Called under s.mu.
func (t *table[T]) drop(s *shard[T], ss slots[T], i int) {
	n := ss[i].Load()
	s.deleteAt(ss, i)
	s.bytes -= t.nodeBytes + allocSize(len(n.s))
	if t.removed != nil {
		t.removed(&n.val)
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
		home := int(n.h) & mask
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
				t.drop(s, ss, i)
				removed++
				continue
			}
			i++
		}
		s.mu.Unlock()
	}
	return removed
}

// tableStats is what a table holds, for metrics and tests.
type tableStats struct {
	entries   int
	bytes     int64
	evictions uint64
	untracked uint64
}

func (t *table[T]) stats() tableStats {
	st := tableStats{bytes: t.extra.Load(), evictions: t.evictions.Load(), untracked: t.untracked.Load()}
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		st.entries += s.n
		st.bytes += s.bytes
		s.mu.Unlock()
	}
	return st
}

// len counts the entries.
func (t *table[T]) len() int { return t.stats().entries }

// allocSize is what the Go allocator hands out for a request of n bytes:
// its size classes up to 32 KiB (runtime/sizeclasses.go), whole pages
// beyond. Objects without pointers below 16 bytes share 16-byte blocks;
// counting a whole block for each is the bound's safe side.
func allocSize(n int) int64 {
	if n == 0 {
		return 0
	}
	if n > sizeClasses[len(sizeClasses)-1] {
		return int64((n + 8191) &^ 8191)
	}
	lo, hi := 0, len(sizeClasses)-1
	for lo < hi {
		m := (lo + hi) / 2
		if sizeClasses[m] < n {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return int64(sizeClasses[lo])
}

var sizeClasses = [...]int{
	8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280,
	1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528,
	6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072,
	20480, 21760, 24576, 27264, 28672, 32768,
}
