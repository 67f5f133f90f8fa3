package enforcement

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// The local tier's state: one entry per (key, scope), one quota share per
// (key, quota), and the limits they resolved, interned per policy. The
// design is at the top of limiter.go.

// policyBox is one policy in force; a new box per SetPolicy. It interns
// the limits resolved under it (refs), so that the entries of a million
// keys of one tier share one copy of that tier's limit.
type policyBox struct {
	p      Policy
	shares Shares       // p's priority classes, read once
	refs   sync.Map     // refKey → *resolvedRef
	nrefs  atomic.Int64 // len(refs)
}

// newPolicyBox boxes p, reading once what it says of priority classes.
func newPolicyBox(p Policy) *policyBox {
	return &policyBox{p: p, shares: SharesOf(p)}
}

// maxSharedRefs bounds a policy's interned limits. Policies resolve to few
// distinct limits (one per tier and rule); past the bound a limit is
// allocated for its entry alone and counted in the local tier's bytes.
const maxSharedRefs = 1 << 16

type refKey struct {
	tier string
	res  Resolved
}

// resolvedRef is a limit resolved under pol for a request naming tier.
// Immutable once published.
type resolvedRef struct {
	pol  *policyBox
	tier string // the requested tier res was resolved for
	res  Resolved
	own  bool // not interned: counted in the entry's bytes
}

var resolvedRefBytes = allocSize(int(unsafe.Sizeof(resolvedRef{})))

// ref returns the interned resolvedRef for (tier, res).
func (b *policyBox) ref(tier string, res Resolved) *resolvedRef {
	k := refKey{tier, res}
	if r, ok := b.refs.Load(k); ok {
		return r.(*resolvedRef)
	}
	r := &resolvedRef{pol: b, tier: tier, res: res}
	if b.nrefs.Load() >= maxSharedRefs {
		r.own = true
		return r
	}
	if got, loaded := b.refs.LoadOrStore(k, r); loaded {
		return got.(*resolvedRef)
	}
	b.nrefs.Add(1)
	return r
}

// entry is the local tier's state of one (key, scope). It is kept small
// (its node is 112 bytes; BenchmarkHeapPerKey): the limit is a pointer to
// one shared copy, and what only a rejecting or degraded entry needs lives
// in x, allocated when first needed and dropped when no longer.
type entry struct {
	mu    sync.Mutex
	epoch uint32 // the store epoch known was learned in (its low bits: a wrap needs 2³² failures between two uses)
	gone  bool   // not in the table (removed, or never kept): x is not counted
	res   *resolvedRef
	known learned // what the shared store last said, trusted within one store epoch
	local Bucket
	// lastUse is µs on the limiter's clock.
	lastUse int64
	x       *entryExtra
}

// entryExtra is the state of an entry that rejects or decides degraded.
type entryExtra struct {
	rej      rejection
	degraded Bucket
}

var entryExtraBytes = allocSize(int(unsafe.Sizeof(entryExtra{})))

// quotaEntry is one key's quota allowance (key, QuotaID) as the degraded
// path needs it. Limits of one key that share a QuotaID share it, as they
// share one counter in the store. It outlives store epochs: the last count
// the store reported is exactly what an outage must start from.
type quotaEntry struct {
	mu sync.Mutex
	// seenEnd and seenUsed are the store's last word on the key's quota
	// window: when it ends (unix seconds; 0 = nothing known) and the tokens
	// spent in it.
	seenEnd  uint32
	gone     bool  // not in the table: dq is not counted
	limit    int64 // the QuotaLimit the state here was learned under
	seenUsed int64
	dq       *degradedQuota // nil until an outage decides for the key
}

var degradedQuotaBytes = allocSize(int(unsafe.Sizeof(degradedQuota{})))

// degradedQuota is what this instance may spend of a quota while the store
// cannot be asked. Spending while degraded is never recorded in the store,
// so it is remembered for the whole window: a second outage in the same
// window starts from the store's newer count less what this instance
// already spent unrecorded.
type degradedQuota struct {
	end        int64 // unix seconds when the window ends; 0 = no window yet
	share      int64 // this instance's share of the remaining quota, fixed at the outage's first decision
	unrecorded int64 // tokens spent while degraded in this window
	stale      bool  // share must be recomputed (the store answered since)
}

// learned is what an entry knows of the shared state from its verdicts.
// Each piece can only be pessimistic: the store refills at the known rate,
// other instances only take, and quota use only grows within a window.
// What a rejection adds is in the entry's extra (rejection).
type learned struct {
	mirror    Bucket // the shared bucket as last reported; TS 0 = nothing known
	quotaUsed int64  // tokens spent in the quota window as last reported
	quotaEnd  int64  // µs when that window ends; 0 = nothing known
}

// rejection is what an entry learned from rejections, kept with the entry's
// extra and forgotten with learned.
type rejection struct {
	// notBefore and blockedCost: the store rejected blockedCost until
	// notBefore (µs); a request costing as much is rejected locally.
	notBefore   int64
	blockedCost int64
	// The last rejection of the pieces above, remembered so that a flood
	// repeating it skips the arithmetic: a request costing rejectCost waits
	// until rejectUntil (µs; 0 = none remembered). It stands because
	// everything it was computed from only changes in learn, which forgets
	// it: a rejection spends nothing, and the mirror refills at a fixed
	// rate, so the wait shrinks exactly as the clock advances. It stops
	// answering mirrorRoundingUS before its end, where the store decides
	// (localWait). rejectFull is when (µs) the mirror will be full, for
	// the rejection's reset time.
	rejectCost, rejectUntil, rejectFull int64
	// rejectResetAt is rejectFull's wall time, placed with rejectAnchor
	// (Limiter.rejectionResetAt).
	rejectResetAt time.Time
	rejectAnchor  *wallAnchor
}

// forget drops what the entry learned from the store. Called under e.mu.
func (e *entry) forget() {
	e.known = learned{}
	if e.x != nil {
		e.x.rej = rejection{}
	}
}

// extra returns the entry's extra, allocating it. Called under e.mu.
func (l *Limiter) extra(e *entry) *entryExtra {
	if e.x == nil {
		e.x = new(entryExtra)
		if !e.gone {
			l.entries.extra.Add(entryExtraBytes)
		}
	}
	return e.x
}

// trimExtra drops the entry's extra once it holds nothing: no rejection
// learned, and a degraded bucket that is full at now. Called under e.mu.
func (l *Limiter) trimExtra(e *entry, now int64) {
	x := e.x
	if x == nil || x.rej.notBefore > now || x.rej.rejectUntil > now {
		return
	}
	if x.degraded.TS != 0 {
		if e.res == nil {
			return
		}
		tight := l.tightened(e.res.res.Limit, l.instN())
		if !x.degraded.Full(now, tight.Rate, tight.Burst) {
			return
		}
	}
	e.x = nil
	if !e.gone {
		l.entries.extra.Add(-entryExtraBytes)
	}
}

// setRef gives the entry its resolved limit, counting one of its own in
// the entry's bytes. Called under e.mu.
func (l *Limiter) setRef(e *entry, r *resolvedRef) {
	if !e.gone {
		if e.res != nil && e.res.own {
			l.entries.extra.Add(-resolvedRefBytes)
		}
		if r.own {
			l.entries.extra.Add(resolvedRefBytes)
		}
	}
	e.res = r
}

// quota returns the quota share of (key, quotaID); wall is the time now.
// One the table could not keep is new and kept nowhere: the degraded path
// then knows nothing of the key's window, as after a restart.
func (l *Limiter) quota(key, quotaID string, wall time.Time) *quotaEntry {
	q, tracked := l.quotas.get(bucketID{key, quotaID}, wall.Unix(), nil)
	if !tracked {
		q.gone = true
	}
	return q
}
