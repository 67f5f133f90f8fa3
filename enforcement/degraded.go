package enforcement

import (
	"math"
	"time"
)

// The failure policy: while the authority cannot be asked, each instance
// decides alone with its share of the limit (tightened) and of the quota
// the store last reported.

// degradedDecision decides with the tightened limit and the quota share
// while the authority cannot be asked.
func (l *Limiter) degradedDecision(req *Request, d Decision, lim Limit, cost int64, e *entry, start reading, nowUS int64) Decision {
	wall := l.wall(start)
	inst := l.instN()
	tight := l.tightened(lim, inst)
	d.Source = SourceDegraded
	d.Limit = tight.Burst
	d.Bucket.Rate, d.Bucket.Burst = tight.Rate, tight.Burst

	var q *quotaEntry
	var quotaEndAt time.Time
	var quotaUsed int64 // the window's spend as this instance knows it: the store's count and its own unrecorded spend
	quotaLeft, quotaWait := int64(math.MaxInt64), time.Duration(0)
	e.mu.Lock() // lock order: entry, then quota
	x := l.extra(e)
	if lim.HasQuota() {
		q = l.quota(req.Key, lim.QuotaID, wall)
		q.mu.Lock()
		_, end := lim.QuotaPeriod.Window(wall)
		quotaEndAt = end
		quotaLeft = l.degradedLeft(q, lim, inst, end.Unix())
		if cost > quotaLeft {
			quotaWait = ceilDurationMS(end.Sub(wall))
		}
	}
	spend := cost
	tight.Share = lim.Share // the class keeps its floor on the tightened bucket, in proportion
	floor := tight.Floor()
	if quotaWait > 0 {
		spend, floor = 0, 0 // a quota rejection spends no bucket tokens, as in the store
	}
	dr := x.degraded.TakeFloor(nowUS, tight.Rate, tight.Burst, spend, floor)
	allowed := dr.Allowed && quotaWait == 0
	var bucketWaitUS int64 // how long the bucket alone would make cost wait
	switch {
	case !dr.Allowed:
		bucketWaitUS = dr.RetryAfterUS
	case quotaWait > 0: // refused by the quota: would the bucket alone have allowed cost?
		probe := x.degraded
		if r := probe.TakeFloor(nowUS, tight.Rate, tight.Burst, cost, tight.Floor()); !r.Allowed {
			bucketWaitUS = r.RetryAfterUS
		}
	}
	if q != nil {
		if allowed {
			q.dq.unrecorded += cost
			quotaLeft -= cost
		}
		quotaUsed = q.dq.unrecorded
		if int64(q.seenEnd) == q.dq.end {
			quotaUsed += q.seenUsed
		}
		q.mu.Unlock()
	}
	e.mu.Unlock()
	if dr.ClockBack && l.cfg.Observer != nil {
		l.cfg.Observer.ClockBack()
	}
	d.WouldAllow = allowed
	if dr.Shed && quotaWait == 0 {
		d.Reason = ReasonShed
	}
	d.Remaining = wholeTokens(dr.Tokens)
	d.ResetAt = wall.Add(time.Duration(dr.ResetAfterUS) * time.Microsecond)
	d.Bucket.Remaining, d.Bucket.ResetAt = d.Remaining, d.ResetAt
	if q != nil {
		d.Quota.Known, d.Quota.Remaining, d.Quota.ResetAt = true, max(0, quotaLeft), quotaEndAt
	}
	if q != nil && quotaLeft < d.Remaining {
		// This instance's share of the quota binds: report it.
		d.Remaining, d.Limit, d.ResetAt = max(0, quotaLeft), lim.QuotaLimit, quotaEndAt
	}
	if !allowed {
		d.RetryAfter = max(time.Duration(ceilMS(bucketWaitUS))*time.Millisecond, quotaWait)
	}
	soft := Limit{Burst: tight.Burst, SoftLimitPercent: lim.SoftLimitPercent, QuotaLimit: lim.QuotaLimit, QuotaPeriod: lim.QuotaPeriod}
	d.Warning = soft.SoftLimitReached(dr.Tokens, quotaUsed)
	l.degradedReservation(req, &d, start)
	l.finish(req, &d, start)
	return d
}

// reset forgets what was learned under another quota limit. Called under q.mu.
func (q *quotaEntry) reset(limit int64) {
	if q.limit != limit {
		q.limit, q.seenUsed, q.seenEnd = limit, 0, 0
		if q.dq != nil {
			*q.dq = degradedQuota{}
		}
	}
}

// degradedLeft is what this instance may still spend of the quota window
// ending at end (unix seconds) while the store cannot be asked. Called
// under q.mu.
func (l *Limiter) degradedLeft(q *quotaEntry, lim Limit, inst float64, end int64) int64 {
	q.reset(lim.QuotaLimit)
	if q.dq == nil {
		q.dq = new(degradedQuota)
		if !q.gone {
			l.quotas.extra.Add(degradedQuotaBytes)
		}
	}
	dq := q.dq
	if dq.end != end { // a new window: nothing spent unrecorded in it yet
		*dq = degradedQuota{end: end, stale: true}
	}
	if dq.stale {
		// The outage's first decision: this instance's share of what the
		// store last said was left. A key the store never reported in this
		// window shares the whole quota, or gets nothing when the policy
		// says so.
		remaining := lim.QuotaLimit
		if int64(q.seenEnd) != end {
			if lim.QuotaDenyUnknown {
				remaining = 0
			}
		} else {
			remaining -= q.seenUsed
		}
		dq.share = int64(math.Floor(float64(max(0, remaining)) / inst))
		dq.stale = false
	}
	return max(0, dq.share-dq.unrecorded)
}

// tightened is the limit each instance enforces alone while the authority is
// unavailable: its fair share of the limit, or the safety ceiling if lower.
func (l *Limiter) tightened(lim Limit, inst float64) Limit {
	t := Limit{
		Rate:             lim.Rate / inst,
		Burst:            max(1, int64(math.Floor(float64(lim.Burst)/inst))),
		SoftLimitPercent: lim.SoftLimitPercent,
	}
	if c := l.cfg.DegradedCeiling; c.Rate > 0 && c.Burst > 0 {
		t.Rate = math.Min(t.Rate, c.Rate)
		t.Burst = min(t.Burst, c.Burst)
	}
	return t
}

// Tightened returns the limit enforced per instance while the shared store is
// unavailable, for the resolved limit lim (documentation and tests).
func (l *Limiter) Tightened(lim Limit) Limit { return l.tightened(lim, l.instN()) }
