package enforcement

// The local tier's bounds: what a full table evicts first, what it never
// evicts, and the sweep of idle entries (Limiter.Run calls Sweep).

// Eviction ranks: the lower score goes first.
const (
	rankFull    = 0 << 62 // restarts as it is: the store forgot it too
	rankPartial = 1 << 62 // restarts full: up to a burst more for its key
)

// rankEntry ranks an entry for eviction at now (µs): full buckets first,
// then partly spent ones, the least recently used first within each; an
// entry that knows its bucket empty (a remembered rejection, the store's
// "not before", an exhausted quota, an empty mirror or local bucket) is
// never evicted, since forgetting it is what a flood needs. Called under
// the shard's mutex.
func (l *Limiter) rankEntry(e *entry, now int64) (uint64, bool) {
	if !e.mu.TryLock() {
		return 0, false // in use right now
	}
	defer e.mu.Unlock()
	age := uint64(max(0, e.lastUse)) // older (smaller) first
	r := e.res
	if r == nil {
		return rankFull | age, true // never decided
	}
	lim := &r.res.Limit
	rate, burst := lim.Rate, lim.Burst
	trusted := e.epoch == uint32(l.epochOf(lim.Store).Load())
	k := &e.known
	if x := e.x; x != nil {
		if trusted && (now < x.rej.rejectUntil || now < x.rej.notBefore) {
			return 0, false
		}
		tight := l.tightened(*lim, l.instN())
		if x.degraded.TS != 0 && x.degraded.refilled(now, tight.Rate, tight.Burst) < 1 {
			return 0, false
		}
	}
	if trusted && now < k.quotaEnd && k.quotaUsed >= lim.QuotaLimit && lim.HasQuota() {
		return 0, false
	}
	if e.local.TS != 0 && e.local.refilled(now, l.localRate(rate), burst) < 1 {
		return 0, false
	}
	full := e.local.Full(now, l.localRate(rate), burst)
	if trusted && k.mirror.TS != 0 {
		t := k.mirror.refilled(now, rate, burst)
		if t < 1 {
			return 0, false
		}
		full = full && t+epsilon >= float64(burst)
	}
	if e.x != nil && e.x.degraded.TS != 0 {
		tight := l.tightened(*lim, l.instN())
		full = full && e.x.degraded.Full(now, tight.Rate, tight.Burst)
	}
	if full {
		return rankFull | age, true
	}
	return rankPartial | age, true
}

// removedEntry marks an entry the table dropped: what it still holds is no
// longer counted. Called under the shard's mutex.
func (l *Limiter) removedEntry(e *entry) {
	e.mu.Lock()
	e.gone = true
	if e.x != nil {
		l.entries.extra.Add(-entryExtraBytes)
	}
	if e.res != nil && e.res.own {
		l.entries.extra.Add(-resolvedRefBytes)
	}
	e.mu.Unlock()
}

// rankQuota ranks a quota share for eviction at now (unix seconds): ended
// windows first, then the least spent; a share that spent unrecorded while
// degraded in its window, or that the store reported exhausted, is never
// evicted (forgetting either would let this instance spend it again).
func (l *Limiter) rankQuota(q *quotaEntry, now int64) (uint64, bool) {
	if !q.mu.TryLock() {
		return 0, false
	}
	defer q.mu.Unlock()
	end := int64(q.seenEnd)
	if q.dq != nil {
		end = max(end, q.dq.end)
		if q.dq.end > now && q.dq.unrecorded > 0 {
			return 0, false
		}
	}
	if end <= now {
		return rankFull, true
	}
	if q.seenUsed >= q.limit {
		return 0, false
	}
	return rankPartial | uint64(max(0, q.seenUsed)), true
}

// removedQuota is removedEntry's counterpart for quota shares.
func (l *Limiter) removedQuota(q *quotaEntry) {
	q.mu.Lock()
	q.gone = true
	if q.dq != nil {
		l.quotas.extra.Add(-degradedQuotaBytes)
	}
	q.mu.Unlock()
}

// DefaultLocalMaxBytes is Config.MaxBytes's default: under a flood of new
// keys (every request a new key) it keeps a limiter within 256 MiB resident
// (BENCHMARKS.md, "Key rotation").
const DefaultLocalMaxBytes = 64 << 20

// LocalStats is what the local tier holds.
type LocalStats struct {
	Entries, QuotaEntries int   // (key, scope) entries; (key, quota) shares
	Bytes, QuotaBytes     int64 // their heap, as the bound counts it
	// Evictions and QuotaEvictions count entries removed to make room;
	// Untracked and QuotaUntracked count new ones that were decided
	// without being kept, every entry being one that protects.
	Evictions, QuotaEvictions uint64
	Untracked, QuotaUntracked uint64
}

// LocalStats returns what the local tier holds now.
func (l *Limiter) LocalStats() LocalStats {
	e, q := l.entries.stats(), l.quotas.stats()
	return LocalStats{
		Entries: e.entries, QuotaEntries: q.entries,
		Bytes: e.bytes, QuotaBytes: q.bytes,
		Evictions: e.evictions, QuotaEvictions: q.evictions,
		Untracked: e.untracked, QuotaUntracked: q.untracked,
	}
}

// Entries is the number of (key, scope) entries the local tier holds.
func (l *Limiter) Entries() int { return l.entries.len() }

// Sweep forgets entries unused for IdleAfter whose buckets are full: they
// would restart exactly as they are.
func (l *Limiter) Sweep() int {
	r := l.read()
	wall, now := l.wall(r), micros(r.off)
	idle := l.cfg.IdleAfter.Microseconds()
	// A quota window that has ended holds nothing the next one needs.
	l.quotas.sweep(func(q *quotaEntry) bool {
		if !q.mu.TryLock() {
			return false
		}
		defer q.mu.Unlock()
		end := int64(q.seenEnd)
		if q.dq != nil {
			end = max(end, q.dq.end)
		}
		return end <= wall.Unix()
	})
	return l.entries.sweep(func(e *entry) bool {
		if !e.mu.TryLock() {
			return false // in use right now
		}
		defer e.mu.Unlock()
		if now-e.lastUse < idle {
			return false
		}
		if e.res == nil {
			return true
		}
		lim := &e.res.res.Limit
		if e.x != nil {
			tight := l.tightened(*lim, l.instN())
			if !e.x.degraded.Full(now, tight.Rate, tight.Burst) {
				return false
			}
		}
		return e.local.Full(now, l.localRate(lim.Rate), lim.Burst)
	})
}
