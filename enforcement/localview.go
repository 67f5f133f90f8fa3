package enforcement

import "time"

// LocalView is what this limiter's local tier holds of one (key, scope):
// what it believes the shared store last said, its own loose bucket, and
// what a rejection taught it. Support tools show it beside the store's
// state (a local rejection is decided here, from this, without asking).
// Times are wall times on this limiter's clock; tokens are refilled to now.
type LocalView struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
	// Held: the local tier holds an entry for the key; the rest is zero
	// when it does not.
	Held bool `json:"held"`
	// Policy and Tier name the limit the entry was resolved to.
	Policy string  `json:"policy,omitempty"`
	Tier   string  `json:"tier,omitempty"`
	Rate   float64 `json:"rate,omitempty"`
	Burst  int64   `json:"burst,omitempty"`
	// Trusted: what the entry learned from the store is still believed
	// (learned since the store's last failure).
	Trusted bool `json:"trusted"`
	// StoreKnown: the entry has a verdict of the store; StoreTokens is
	// that bucket as the store reported it, refilled to now at the rate.
	StoreKnown  bool    `json:"storeKnown"`
	StoreTokens float64 `json:"storeTokens"`
	// QuotaUsed is the window's spend as the store last reported it
	// (QuotaEnd zero: none known).
	QuotaUsed int64     `json:"quotaUsed"`
	QuotaEnd  time.Time `json:"quotaEnd,omitzero"`
	// LocalTokens is the flood filter's bucket (rate × headroom ÷ the
	// instance count), refilled to now.
	LocalTokens float64 `json:"localTokens"`
	// RejectingUntil: a rejection the store made is repeated locally until
	// then, for requests costing at least RejectedCost (zero: none).
	RejectingUntil time.Time `json:"rejectingUntil,omitzero"`
	RejectedCost   int64     `json:"rejectedCost,omitempty"`
	// DegradedTokens is the tightened bucket of an outage, when one decided
	// for the key (nil: none).
	DegradedTokens *float64 `json:"degradedTokens,omitempty"`
	// LastUse is the entry's last decision.
	LastUse   time.Time `json:"lastUse,omitzero"`
	Instances int       `json:"instances"`
	At        time.Time `json:"at"`
}

// LocalView returns the local tier's view of (key, scope), creating
// nothing. Safe for concurrent use with decisions.
func (l *Limiter) LocalView(key, scope string) LocalView {
	r := l.read()
	now, wall := micros(r.off), l.wall(r)
	at := func(us int64) time.Time {
		if us == 0 {
			return time.Time{}
		}
		return wall.Add(time.Duration(us-now) * time.Microsecond)
	}
	v := LocalView{Key: key, Scope: scope, Instances: l.Instances(), At: wall}
	e, ok := l.entries.lookup(bucketID{key, scope})
	if !ok {
		return v
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	v.Held, v.LastUse = true, at(e.lastUse)
	if e.res == nil {
		return v
	}
	lim := e.res.res.Limit
	v.Policy, v.Tier, v.Rate, v.Burst = e.res.res.Policy, e.res.res.Tier, lim.Rate, lim.Burst
	v.Trusted = e.epoch == uint32(l.epochOf(lim.Store).Load())
	if k := e.known; k.mirror.TS != 0 {
		v.StoreKnown = true
		v.StoreTokens = k.mirror.refilled(now, lim.Rate, lim.Burst)
		v.QuotaUsed, v.QuotaEnd = k.quotaUsed, at(k.quotaEnd)
	}
	v.LocalTokens = float64(lim.Burst)
	if e.local.TS != 0 {
		v.LocalTokens = e.local.refilled(now, l.localRate(lim.Rate), lim.Burst)
	}
	if x := e.x; x != nil {
		if until := max(x.rej.notBefore, x.rej.rejectUntil); until > now {
			v.RejectingUntil, v.RejectedCost = at(until), x.rej.blockedCost
		}
		if x.degraded.TS != 0 {
			tight := l.tightened(lim, l.instN())
			t := x.degraded.refilled(now, tight.Rate, tight.Burst)
			v.DegradedTokens = &t
		}
	}
	return v
}

// Forget drops what the local tier learned of (key, scope) and of the
// key's quota windows: the next decision asks the store, as a new
// instance would. A support reset calls it on every limiter, so that none
// goes on answering from what the store said before the reset. It reports
// whether the local tier held anything of the key.
func (l *Limiter) Forget(key, scope string) bool {
	held := false
	if e, ok := l.entries.lookup(bucketID{key, scope}); ok {
		held = true
		e.mu.Lock()
		e.forget()
		e.local = Bucket{}
		if e.x != nil {
			e.x.degraded = Bucket{}
		}
		var quotaID string
		if e.res != nil && e.res.res.HasQuota() {
			quotaID = e.res.res.QuotaID
		}
		e.mu.Unlock()
		if quotaID != "" {
			if q, ok := l.quotas.lookup(bucketID{key, quotaID}); ok {
				q.mu.Lock()
				q.seenUsed, q.seenEnd = 0, 0
				if q.dq != nil {
					q.dq.stale = true
				}
				q.mu.Unlock()
			}
		}
	}
	return held
}
