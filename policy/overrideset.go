package policy

// The override set is built to hold millions of overrides in one copy
// that the policy log's state and every policy in force share.
//
// Layout: overrides are spread over overrideShards shards by a hash of
// their key. A shard's open-addressing table maps a key to the first of
// its entries in a slab of fixed-width entries (the key, numbers, an
// interned tier and scope); the entries of one key (its own, one per
// scope) are chained. Finding the override of a request is one hash, one
// probe of a table and a walk of that key's chain.
//
// Sharing: Snapshot returns an immutable view that shares every shard
// with the set it was taken from. That set copies a shard the first time
// it changes it afterwards (copy on write), so a revision that changes one
// override copies one shard (a thousandth of a million overrides), not
// the set, and a reader of the log applies a million records to one set
// and takes one snapshot at the end.

import (
	"hash/maphash"
	"maps"
	"math/bits"
	"slices"
	"strconv"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// overrideShards is the number of shards: what one change of a snapshot's
// set copies is about 1/overrideShards of the set.
const (
	shardBits      = 10
	overrideShards = 1 << shardBits
)

// noEntry ends a chain of entries.
const noEntry = ^uint32(0)

// OverrideTag is what the policy log remembers of the record an override
// came from: its revision and the first 64 bits of its SHA-256, and who
// set it and why, for the engineer who finds it in force (support's
// inspect): the record's author (its signing key's identity), the
// override's reason and the record's message. Empty strings: not known
// (an override put without its record, such as the policy cache's).
type OverrideTag struct {
	Revision int64
	SHA      uint64
	Author   string
	Reason   string
	Message  string
}

// overrideNote is the text of a tag, interned: a bulk write of many
// overrides by one author with one reason holds that text once.
type overrideNote struct{ author, reason, message string }

// entry is an Override reduced to what resolution and the log's apply
// rule need, and its key, in 88 bytes (the note's index fits in what
// would be padding).
type entry struct {
	key     string
	rate    float64 // tokens per second; 0 = the tier's
	burst   int64
	quota   int64
	expires int64  // Unix nanoseconds; 0 = never
	rev     int64  // the tag's Revision
	sha     uint64 // the tag's SHA
	next    uint32 // the key's next entry (noEntry: the last)
	scope   uint32 // 1 + index in Overrides.scopes; 0 = the key's own
	tier    uint16 // 1 + index in Overrides.tiers; 0 = none
	store   uint16 // 1 + index in Overrides.stores; 0 = the document's routing
	qperiod uint8  // limits.Period
	region  uint8  // regionGlobal, regionRegional; 0 = the document's
	conc    uint32 // concurrency limit; 0 = the document's
	note    uint32 // 1 + index in Overrides.notes; 0 = none
}

// entry.region values.
const (
	regionGlobal   = 1
	regionRegional = 2
)

func regionOf(scope string) uint8 {
	switch scope {
	case ScopeGlobal:
		return regionGlobal
	case ScopeRegional:
		return regionRegional
	}
	return 0
}

func scopeOf(region uint8) string {
	switch region {
	case regionGlobal:
		return ScopeGlobal
	case regionRegional:
		return ScopeRegional
	}
	return ""
}

// shard is a part of the set: an open-addressing table (linear probing)
// from a key to its first entry in ents, and the entries; freed entries
// are chained from free, for reuse. A slot is 0 (empty) or the high 32
// bits of the key's hash and 1 + the entry's index: a probe compares a
// key only when those bits match, so a key without an override costs
// about one cache line of the table.
type shard struct {
	seed  maphash.Seed // the set's
	slots []uint64
	used  int // occupied slots
	ents  []entry
	free  uint32
}

func (sh *shard) clone() shard {
	return shard{seed: sh.seed, slots: slices.Clone(sh.slots), used: sh.used, ents: slices.Clone(sh.ents), free: sh.free}
}

// home is where a key of hash h starts probing (the low bits chose the
// shard).
func (sh *shard) home(h uint64) int { return int(h>>shardBits) & (len(sh.slots) - 1) }

// lookup is the slot of key (hash h) and its first entry.
func (sh *shard) lookup(h uint64, key string) (pos int, first uint32, ok bool) {
	if len(sh.slots) == 0 {
		return 0, 0, false
	}
	tag := h >> 32 << 32
	mask := len(sh.slots) - 1
	for pos = sh.home(h); ; pos = (pos + 1) & mask {
		v := sh.slots[pos]
		if v == 0 {
			return pos, 0, false
		}
		if v&^0xffffffff == tag && sh.ents[uint32(v)-1].key == key {
			return pos, uint32(v) - 1, true
		}
	}
}

// insert puts first, the first entry of a key of hash h not in the table.
func (sh *shard) insert(h uint64, first uint32) {
	if (sh.used+1)*4 > len(sh.slots)*3 {
		sh.grow()
	}
	mask := len(sh.slots) - 1
	pos := sh.home(h)
	for sh.slots[pos] != 0 {
		pos = (pos + 1) & mask
	}
	sh.slots[pos] = h>>32<<32 | uint64(first+1)
	sh.used++
}

func (sh *shard) grow() {
	old := sh.slots
	sh.slots, sh.used = make([]uint64, max(8, 2*len(old))), 0
	for _, v := range old {
		if v != 0 {
			sh.insert(sh.hashOf(v), uint32(v)-1)
		}
	}
}

// hashOf is the hash of the key of slot value v.
func (sh *shard) hashOf(v uint64) uint64 { return maphash.String(sh.seed, sh.ents[uint32(v)-1].key) }

// remove empties slot pos, moving back the slots after it that probed
// past it (backward-shift deletion: no tombstones).
func (sh *shard) remove(pos int) {
	mask := len(sh.slots) - 1
	sh.slots[pos] = 0
	sh.used--
	for j := (pos + 1) & mask; sh.slots[j] != 0; j = (j + 1) & mask {
		k := sh.home(sh.hashOf(sh.slots[j]))
		// The slot at j may fill the hole at pos when its home is not
		// in (pos, j], cyclically.
		if (j > pos && (k <= pos || k > j)) || (j < pos && k <= pos && k > j) {
			sh.slots[pos], sh.slots[j] = sh.slots[j], 0
			pos = j
		}
	}
}

// Overrides is a set of validated overrides, ready to resolve. Build it
// with NewOverrides and Put; a set handed to WithOverrides must not be
// changed afterwards: hand it a Snapshot, which never changes and is safe
// for concurrent reads, and keep changing the set. A set is not safe for
// concurrent changes.
type Overrides struct {
	seed   maphash.Seed
	shards []shard // nil until the first Put; a shard with no slots is empty
	own    []bool  // own[i]: shards[i] is not shared with a snapshot
	n      int
	hint   int      // expected overrides per shard, for a new shard's map
	tiers  []string // the tier names overrides use, interned (few)
	scopes []string // the scopes overrides name, interned
	// scopeIDs indexes scopes (1-based); nil in a snapshot.
	scopeIDs map[string]uint32
	// stores are the store names overrides route to, interned; routed[i]
	// counts the overrides naming stores[i] (Stores lists those in use),
	// and routing their sum, so that resolution looks for a key's store
	// only when some override routes one.
	stores  []string
	routed  []int
	routing int
	// concurrent: some override set a concurrency limit (never cleared:
	// it says only that one may resolve, see HasConcurrency).
	concurrent bool
	// notes are the tags' texts, interned (1-based; noteIDs indexes them,
	// nil in a snapshot). Append-only, as scopes: a snapshot shares them,
	// so the text of a replaced override stays until the set is rebuilt
	// (an epoch, a restart).
	notes   []overrideNote
	noteIDs map[overrideNote]uint32
}

// NewOverrides returns an empty set with room for about n overrides.
func NewOverrides(n int) *Overrides {
	return &Overrides{seed: maphash.MakeSeed(), hint: n / overrideShards, scopeIDs: map[string]uint32{}}
}

// hash is key's hash: its low shardBits choose the shard.
func (s *Overrides) hash(key string) uint64 { return maphash.String(s.seed, key) }

func shardOf(h uint64) int { return int(h & (overrideShards - 1)) }

// mutable is shard i, copied first when a snapshot shares it.
func (s *Overrides) mutable(i int) *shard {
	if s.shards == nil {
		s.shards, s.own = make([]shard, overrideShards), make([]bool, overrideShards)
	}
	sh := &s.shards[i]
	switch {
	case sh.slots == nil:
		*sh = shard{seed: s.seed, free: noEntry}
		if s.hint > 0 {
			sh.slots, sh.ents = make([]uint64, max(8, 1<<bits.Len(uint(s.hint*4/3)))), make([]entry, 0, s.hint)
		}
	case !s.own[i]:
		*sh = sh.clone()
	}
	s.own[i] = true
	return sh
}

// internFew returns 1 + the index of name in *names, appended when new
// (0 for ""), and whether it was. For the few names a set has (tiers,
// stores): a scan beats a map.
func internFew(names *[]string, name string) (uint16, bool) {
	if name == "" {
		return 0, false
	}
	if i := slices.Index(*names, name); i >= 0 {
		return uint16(i + 1), false
	}
	*names = append(*names, name)
	return uint16(len(*names)), true
}

// nameAt is the name interned as i (0: "").
func nameAt(names []string, i uint16) string {
	if i == 0 {
		return ""
	}
	return names[i-1]
}

func (s *Overrides) tierIndex(name string) uint16 {
	i, _ := internFew(&s.tiers, name)
	return i
}

func (s *Overrides) tierName(i uint16) string { return nameAt(s.tiers, i) }

// scopeIndex interns a scope (1-based; 0 = none).
func (s *Overrides) scopeIndex(scope string) uint32 {
	if scope == "" {
		return 0
	}
	if i, ok := s.scopeIDs[scope]; ok {
		return i
	}
	s.scopes = append(s.scopes, scope)
	s.scopeIDs[scope] = uint32(len(s.scopes))
	return uint32(len(s.scopes))
}

// noteIndex interns the text of tag (1-based; 0 = none). The last note
// is tried first: a bulk write repeats it.
func (s *Overrides) noteIndex(tag OverrideTag) uint32 {
	n := overrideNote{tag.Author, tag.Reason, tag.Message}
	if n == (overrideNote{}) {
		return 0
	}
	if l := len(s.notes); l > 0 && s.notes[l-1] == n {
		return uint32(l)
	}
	if i, ok := s.noteIDs[n]; ok {
		return i
	}
	if s.noteIDs == nil {
		s.noteIDs = map[overrideNote]uint32{}
	}
	s.notes = append(s.notes, n)
	s.noteIDs[n] = uint32(len(s.notes))
	return uint32(len(s.notes))
}

// tagOf is e's tag with its text.
func (s *Overrides) tagOf(e *entry) OverrideTag {
	t := OverrideTag{Revision: e.rev, SHA: e.sha}
	if e.note != 0 {
		n := s.notes[e.note-1]
		t.Author, t.Reason, t.Message = n.author, n.reason, n.message
	}
	return t
}

func (s *Overrides) scopeName(i uint32) string {
	if i == 0 {
		return ""
	}
	return s.scopes[i-1]
}

// Len is the number of overrides in the set.
func (s *Overrides) Len() int { return s.n }

func (s *Overrides) storeIndex(name string) uint16 {
	i, added := internFew(&s.stores, name)
	if added {
		s.routed = append(s.routed, 0)
	}
	return i
}

func (s *Overrides) storeName(i uint16) string { return nameAt(s.stores, i) }

// count adds d to the routing counts of store (an entry's store index).
func (s *Overrides) count(store uint16, d int) {
	if store != 0 {
		s.routed[store-1] += d
		s.routing += d
	}
}

// Stores lists the store names some override of the set routes a key to
// (sorted; expired overrides included).
func (s *Overrides) Stores() []string {
	var out []string
	for i, n := range s.routed {
		if n > 0 {
			out = append(out, s.stores[i])
		}
	}
	slices.Sort(out)
	return out
}

// route is res with the store the whole key's override own routes it to
// when that override is in force at now (own nil: none).
func (s *Overrides) route(res limits.Resolved, err error, own *entry, now int64) limits.Resolved {
	if err == nil && s.routing > 0 && own != nil && own.store != 0 && (own.expires == 0 || now < own.expires) {
		res.Store = s.storeName(own.store)
	}
	return res
}

// Put adds or replaces the override of k. o must be valid (Validate).
func (s *Overrides) Put(k OverrideKey, o Override) { s.PutTagged(k, o, OverrideTag{}) }

// PutTagged is Put remembering tag with the override (Tag returns it).
// The override's own Reason is not kept: the tag's is.
func (s *Overrides) PutTagged(k OverrideKey, o Override, tag OverrideTag) {
	e := entry{key: k.Key, tier: s.tierIndex(o.Tier), store: s.storeIndex(o.Store), burst: o.Burst, quota: o.Quota, qperiod: uint8(quotaPeriods[o.QuotaPeriod]),
		rev: tag.Revision, sha: tag.SHA, note: s.noteIndex(tag), scope: s.scopeIndex(k.Scope), next: noEntry, region: regionOf(o.Scope), conc: uint32(o.Concurrency)}
	s.concurrent = s.concurrent || o.Concurrency > 0
	if o.Rate > 0 {
		e.rate = o.Rate / periodSeconds[o.Period]
	}
	if !o.Expires.IsZero() {
		e.expires = o.Expires.UnixNano()
	}
	h := s.hash(k.Key)
	sh := s.mutable(shardOf(h))
	pos, first, ok := sh.lookup(h, k.Key)
	if ok {
		for i := first; i != noEntry; i = sh.ents[i].next {
			if sh.ents[i].scope == e.scope {
				s.count(sh.ents[i].store, -1)
				s.count(e.store, 1)
				e.next = sh.ents[i].next
				sh.ents[i] = e
				return
			}
		}
		e.next = first
	}
	i := sh.free
	if i != noEntry {
		sh.free = sh.ents[i].next
		sh.ents[i] = e
	} else {
		i = uint32(len(sh.ents))
		sh.ents = append(sh.ents, e)
	}
	if ok {
		sh.slots[pos] = sh.slots[pos]&^0xffffffff | uint64(i+1)
	} else {
		sh.insert(h, i)
	}
	s.count(e.store, 1)
	s.n++
}

// Delete removes the override of k.
func (s *Overrides) Delete(k OverrideKey) {
	if s.n == 0 {
		return
	}
	h := s.hash(k.Key)
	si := shardOf(h)
	if _, _, ok := s.shards[si].lookup(h, k.Key); !ok {
		return
	}
	scope, known := s.scopeIDs[k.Scope]
	if k.Scope != "" && !known {
		return
	}
	sh := s.mutable(si)
	pos, first, _ := sh.lookup(h, k.Key)
	prev := noEntry
	for i := first; i != noEntry; prev, i = i, sh.ents[i].next {
		if sh.ents[i].scope != scope {
			continue
		}
		switch next := sh.ents[i].next; {
		case prev != noEntry:
			sh.ents[prev].next = next
		case next == noEntry:
			sh.remove(pos)
		default:
			sh.slots[pos] = sh.slots[pos]&^0xffffffff | uint64(next+1)
		}
		s.count(sh.ents[i].store, -1)
		sh.ents[i] = entry{next: sh.free}
		sh.free = i
		s.n--
		return
	}
}

// Tag is the tag the override of k was put with, and whether k has one.
func (s *Overrides) Tag(k OverrideKey) (OverrideTag, bool) {
	if e := s.entryOf(k); e != nil {
		return s.tagOf(e), true
	}
	return OverrideTag{}, false
}

// entryOf is k's entry (nil: none).
func (s *Overrides) entryOf(k OverrideKey) *entry {
	scoped, own := s.find(k.Key, k.Scope)
	if k.Scope == "" {
		return own
	}
	return scoped
}

// find returns the entries of key in scope and of key alone (nil: none).
// It is the hot path: one hash, one probe of a table, a walk of the
// key's chain.
func (s *Overrides) find(key, scope string) (scoped, own *entry) {
	if s.n == 0 {
		return nil, nil
	}
	h := s.hash(key)
	sh := &s.shards[shardOf(h)]
	_, i, ok := sh.lookup(h, key)
	if !ok {
		return nil, nil
	}
	for ; i != noEntry; i = sh.ents[i].next {
		e := &sh.ents[i]
		if e.scope == 0 {
			own = e
		} else if scope != "" && s.scopes[e.scope-1] == scope {
			scoped = e
		}
	}
	return scoped, own
}

// Snapshot returns the set as it is now, immutable and safe for
// concurrent reads; it shares the set's storage, which s copies, shard by
// shard, as it changes afterwards.
func (s *Overrides) Snapshot() *Overrides {
	clear(s.own)
	return &Overrides{seed: s.seed, shards: slices.Clone(s.shards), n: s.n,
		tiers: s.tiers[:len(s.tiers):len(s.tiers)], scopes: s.scopes[:len(s.scopes):len(s.scopes)],
		stores: s.stores[:len(s.stores):len(s.stores)], routed: slices.Clone(s.routed), routing: s.routing, concurrent: s.concurrent,
		notes: s.notes[:len(s.notes):len(s.notes)]}
}

// Clone returns a copy of s that can be changed without touching s; the
// two share storage until either changes it.
func (s *Overrides) Clone() *Overrides {
	c := s.Snapshot()
	c.hint = s.hint
	c.tiers, c.scopes, c.scopeIDs, c.stores = slices.Clone(s.tiers), slices.Clone(s.scopes), maps.Clone(s.scopeIDs), slices.Clone(s.stores)
	c.notes, c.noteIDs = slices.Clone(s.notes), maps.Clone(s.noteIDs)
	if c.scopeIDs == nil {
		c.scopeIDs = map[string]uint32{}
	}
	if c.shards != nil {
		c.own = make([]bool, overrideShards)
	}
	return c
}

// each calls fn for every entry of the set, in no order.
func (s *Overrides) each(fn func(OverrideKey, *entry)) { s.eachIn(0, len(s.shards), fn) }

// eachIn is each over the shards lo … hi-1.
func (s *Overrides) eachIn(lo, hi int, fn func(OverrideKey, *entry)) {
	for si := lo; si < hi; si++ {
		sh := &s.shards[si]
		for _, v := range sh.slots {
			if v == 0 {
				continue
			}
			for i := uint32(v) - 1; i != noEntry; i = sh.ents[i].next {
				fn(OverrideKey{Key: sh.ents[i].key, Scope: s.scopeName(sh.ents[i].scope)}, &sh.ents[i])
			}
		}
	}
}

// MissingTiers lists the overrides that name a tier p does not define, as
// "override <key>[ scope <scope>] names tier <tier>", sorted.
func (s *Overrides) MissingTiers(p *Policy) []string {
	missing := map[uint16]bool{}
	for i, name := range s.tiers {
		if _, ok := p.tiers[name]; !ok {
			missing[uint16(i+1)] = true
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var out []string
	s.each(func(k OverrideKey, e *entry) {
		if !missing[e.tier] {
			return
		}
		what := "override " + k.Key
		if k.Scope != "" {
			what += " scope " + k.Scope
		}
		out = append(out, what+" names tier "+strconv.Quote(s.tierName(e.tier)))
	})
	slices.Sort(out)
	return out
}

// Each calls fn for every override of the set, in no order, as an Override
// that Put would compile to the same entry (its rate per second, without
// its reason).
func (s *Overrides) Each(fn func(OverrideKey, Override)) {
	s.EachTagged(func(k OverrideKey, o Override, _ OverrideTag) { fn(k, o) })
}

// EachTagged is Each with the tag each override was put with.
func (s *Overrides) EachTagged(fn func(OverrideKey, Override, OverrideTag)) {
	s.EachTaggedPart(0, 1, fn)
}

// EachTaggedPart is EachTagged over part part of parts (0 ≤ part <
// parts): the parts are disjoint and make up the set, so that they can be
// walked at the same time, by as many goroutines, while nothing changes
// the set.
func (s *Overrides) EachTaggedPart(part, parts int, fn func(OverrideKey, Override, OverrideTag)) {
	n := len(s.shards)
	s.eachIn(part*n/parts, (part+1)*n/parts, func(k OverrideKey, e *entry) {
		o := Override{Tier: s.tierName(e.tier), Store: s.storeName(e.store), Rate: e.rate, Burst: e.burst, Quota: e.quota, Scope: scopeOf(e.region), Concurrency: int64(e.conc)}
		if p := limits.Period(e.qperiod); p != limits.PeriodNone {
			o.QuotaPeriod = p.String()
		}
		if e.expires != 0 {
			o.Expires = time.Unix(0, e.expires).UTC()
		}
		fn(k, o, s.tagOf(e))
	})
}
