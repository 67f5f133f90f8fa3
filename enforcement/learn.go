package enforcement

import "time"

// The local tier's answer, and what it learns from the shared store's
// replies: the mirror of the bucket, the store's "not before" after a
// rejection, and the quota window's count the degraded path starts from.

// learnQuota keeps the store's count of the key's quota window for the
// degraded path.
func (l *Limiter) learnQuota(key string, lim Limit, v *Verdict) {
	_, end := lim.QuotaPeriod.Window(v.Now)
	q := l.quota(key, lim.QuotaID, v.Now)
	q.mu.Lock()
	q.reset(lim.QuotaLimit)
	q.seenUsed, q.seenEnd = v.QuotaUsed, uint32(end.Unix())
	if q.dq != nil {
		q.dq.stale = true // the next outage starts from this count
	}
	q.mu.Unlock()
}

// localVerdict is the local tier's answer: wait is 0 when the request
// should go to the shared store, else the µs until it could pass. A
// rejection made while the shared bucket's mirror is known reports the
// mirror refilled to now: its tokens, and the µs until it is full.
type localVerdict struct {
	wait          int64
	remembered    bool // the rejection remembered in learned was repeated
	mirrorKnown   bool
	mirrorTokens  float64
	mirrorResetUS int64
}

// mirrorRoundingUS is the mirror's rounding (the store reports to the
// millisecond): a rejection the mirror alone would make within it is left
// to the store, and a remembered one stops answering that long before its
// end.
const mirrorRoundingUS = 1000

// localWait is the local tier: it fills v, which starts zero. Called
// under e.mu.
func (l *Limiter) localWait(e *entry, now, cost int64, flood bool, v *localVerdict) {
	k, res := &e.known, &e.res.res
	if x := e.x; x != nil {
		r := &x.rej
		if now < r.rejectUntil-mirrorRoundingUS && cost == r.rejectCost {
			v.wait, v.remembered = r.rejectUntil-now, true
			if k.mirror.TS != 0 {
				v.mirrorKnown = true
				v.mirrorTokens = k.mirror.refilled(now, res.Rate, res.Burst)
				v.mirrorResetUS = r.rejectFull - now
			}
			return
		}
		if now < r.notBefore && cost >= r.blockedCost {
			v.wait = r.notBefore - now
		}
	}
	if now < k.quotaEnd && k.quotaUsed+cost > res.QuotaLimit {
		v.wait = max(v.wait, k.quotaEnd-now)
	}
	probed := false
	// The store's own retry time for this very cost needs no second opinion.
	if k.mirror.TS != 0 && !(v.wait > 0 && e.x != nil && cost == e.x.rej.blockedCost) {
		probe := k.mirror
		// The mirror is rounded to the store's millisecond; within that
		// rounding, let the store decide.
		if r := probe.Take(now, res.Rate, res.Burst, cost); !r.Allowed {
			// Refused: nothing was spent, so r is the mirror refilled to now.
			probed = true
			v.mirrorTokens, v.mirrorResetUS = r.Tokens, r.ResetAfterUS
			if r.RetryAfterUS > mirrorRoundingUS {
				v.wait = max(v.wait, r.RetryAfterUS)
			}
		}
	}
	if v.wait > 0 {
		if k.mirror.TS != 0 {
			v.mirrorKnown = true
			if !probed {
				v.mirrorTokens = k.mirror.refilled(now, res.Rate, res.Burst)
				v.mirrorResetUS = ceilUS((float64(res.Burst) - v.mirrorTokens) / res.Rate)
			}
		}
		r := &l.extra(e).rej
		r.rejectCost, r.rejectUntil = cost, now+v.wait
		r.rejectFull = now + v.mirrorResetUS
		return
	}
	// The local bucket's rejections are not remembered: its rate follows
	// the instance count, and the requests it allows spend from it. Only
	// requests that may be refused on a flood's account ask it (flood).
	if !flood {
		return
	}
	if r := e.local.Take(now, l.localRate(res.Rate), res.Burst, cost); !r.Allowed {
		v.wait = r.RetryAfterUS
	}
}

// rejectionResetAt is the wall time a local rejection reports the bucket
// full at, reset µs after start. While a rejection is remembered that is a
// fixed instant (the mirror refills at its rate and nothing is spent), so
// its wall time is kept with the rejection and computed again only when the
// clock's wall anchor has moved. Called under e.mu.
func (l *Limiter) rejectionResetAt(e *entry, lw *localVerdict, start reading, reset int64) time.Time {
	if !lw.mirrorKnown || l.cfg.Now != nil || e.x == nil {
		return l.wallAfter(start, time.Duration(reset)*time.Microsecond)
	}
	r := &e.x.rej
	if a := l.anchor.Load(); !lw.remembered || a != r.rejectAnchor {
		r.rejectAnchor, r.rejectResetAt = a, l.wallAfter(start, time.Duration(reset)*time.Microsecond)
	}
	return r.rejectResetAt
}

// learn updates what the entry knows from a shared verdict. The store
// reports when the bucket will be full again, so the tokens left are
// burst − reset × rate (rounded down by the store's millisecond: never more
// than are there). Called under e.mu.
func (l *Limiter) learn(e *entry, now int64, wall time.Time, lim Limit, cost int64, v *Verdict) {
	if lim.Split > 1 {
		// The verdict is one sub-bucket's; the others may well have room.
		return
	}
	k := &e.known
	if e.x != nil {
		e.x.rej.rejectUntil = 0 // computed from what is replaced below
	}
	// Below zero when the bucket is in debt (a settle or a charge took
	// more than was there): the mirror then rejects until it is paid off.
	tokens := float64(lim.Burst) - v.ResetAfter.Seconds()*lim.Rate
	k.mirror = Bucket{Tokens: tokens, TS: now}
	if lim.HasQuota() {
		// The window is the store's; its end is placed on this clock.
		_, end := lim.QuotaPeriod.Window(v.Now)
		k.quotaUsed, k.quotaEnd = v.QuotaUsed, now+end.Sub(wall).Microseconds()
	}
	if v.Allowed {
		if e.x != nil {
			e.x.rej.notBefore = 0
			l.trimExtra(e, now)
		}
		return
	}
	r := &l.extra(e).rej
	r.notBefore, r.blockedCost = now+v.RetryAfter.Microseconds(), cost
}

func (l *Limiter) localRate(rate float64) float64 {
	return rate * l.cfg.LocalHeadroom / l.instN()
}
