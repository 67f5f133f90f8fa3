package policy

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// Override is an operator's limit for one key, or one key in one scope,
// kept in the policy log (docs/policy-log.md, "The policy log"). It applies
// ahead of every rule of the document; global_ceiling still caps it. It
// sets either a tier (the tier's limit, and the tier reported on the
// decision) or its own rate and burst, optionally a calendar quota; an
// Expires in the past makes it stop applying by itself. Field names are the
// wire's (JSON in the log record).
type Override struct {
	Tier        string    `json:"tier,omitempty"`
	Rate        float64   `json:"rate,omitempty"`
	Burst       int64     `json:"burst,omitempty"`
	Period      string    `json:"period,omitempty"` // of Rate: second (default), minute, hour, day
	Quota       int64     `json:"quota,omitempty"`
	QuotaPeriod string    `json:"quota_period,omitempty"` // hour, day, month
	Expires     time.Time `json:"expires,omitzero"`       // zero = never
	Reason      string    `json:"reason"`
	// Store routes the key to a named store (dedicated capacity,
	// REDIS_STORES): every scope of the key is then decided, leased and
	// counted by that store, ahead of the document's routing. Only an
	// override of the whole key (no scope) may set it; alone, it moves the
	// key and leaves its limit to the document. "" = the document's routing.
	Store string `json:"store,omitempty"`
	// Scope is global or regional, as a tier's: the override's limit is
	// then shared by every region, or enforced by each on its own; "" =
	// the document's. Alone, it changes only that.
	Scope string `json:"scope,omitempty"`
	// Concurrency bounds the key's (or the key and scope's) requests in
	// flight, fleet-wide, in place of the document's; 0 = the document's.
	// It goes with a tier, a rate and burst, or alone.
	Concurrency int64 `json:"concurrency,omitempty"`
}

// MaxOverrideReason bounds an override's reason.
const MaxOverrideReason = 1024

// Validate reports every problem of o against the document p (the tier it
// names must exist there), joined; nil when o is valid.
func (o Override) Validate(p *Policy) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Reason == "" {
		fail("reason: required (who asked for it, why)")
	} else if len(o.Reason) > MaxOverrideReason {
		fail("reason: at most %d bytes, got %d", MaxOverrideReason, len(o.Reason))
	}
	hasRate := o.Rate != 0 || o.Burst != 0 || o.Period != ""
	switch {
	case o.Tier == "" && !hasRate && o.Quota == 0 && o.Store == "" && o.Scope == "" && o.Concurrency == 0:
		fail("override: sets nothing: give a tier, or a rate and burst, or a quota, or a store, or a scope, or a concurrency")
	case o.Tier != "" && hasRate:
		fail("override: a tier or a rate and burst, not both")
	}
	if o.Tier != "" && p != nil {
		if _, ok := p.tiers[o.Tier]; !ok {
			fail("tier: %q is not defined by the policy document", o.Tier)
		}
	}
	if hasRate {
		ps, ok := periodSeconds[o.Period]
		if !ok {
			fail("period: %q is not second, minute, hour or day", o.Period)
			ps = 1
		}
		if !(o.Rate > 0) || math.IsInf(o.Rate, 0) {
			fail("rate: must be > 0 (with burst), got %v", o.Rate)
		}
		if o.Burst < 1 || o.Burst > 1<<50 {
			fail("burst: must be between 1 and 2^50 (with rate), got %d", o.Burst)
		}
		if o.Rate > 0 && o.Burst >= 1 && float64(o.Burst)/(o.Rate/ps) > maxRefill {
			fail("rate: an empty bucket of %d would take more than ten years to refill", o.Burst)
		}
	}
	if o.Quota != 0 || o.QuotaPeriod != "" {
		if o.Quota < 1 || o.Quota > 1<<50 {
			fail("quota: must be between 1 and 2^50, got %d", o.Quota)
		}
		if _, ok := quotaPeriods[o.QuotaPeriod]; !ok {
			fail("quota_period: %q is not hour, day or month", o.QuotaPeriod)
		}
	}
	if o.Concurrency < 0 || o.Concurrency > limits.MaxConcurrency {
		fail("concurrency: must be between 1 and %d requests in flight (0: the document's), got %d", limits.MaxConcurrency, o.Concurrency)
	}
	if o.Scope != "" && o.Scope != ScopeGlobal && o.Scope != ScopeRegional {
		fail("scope: must be global or regional, got %q", truncate(o.Scope, 40))
	}
	if o.Scope == ScopeGlobal && p != nil && p.Sheds() {
		fail("scope: a global limit cannot keep a priority class's floor (its regions spend from pools), and the policy has a class below share 1: use regional")
	}
	if o.Store != "" && !limits.ValidStoreName(o.Store) {
		fail("store: %q is not a store name (letters, digits, '_' and '-', at most 64; not %q)", truncate(o.Store, 40), limits.DefaultStore)
	}
	return errors.Join(errs...)
}

// OverrideKey names what an override applies to: a key in every scope
// (Scope empty) or a key in one scope.
type OverrideKey struct {
	Key   string
	Scope string
}

// WithOverrides is a document with its overrides: the policy a limiter in
// log mode enforces. It implements enforcement.Policy and, through the
// embedded document, the shadow resolution (overrides are not trialled).
// Immutable and safe for concurrent use.
type WithOverrides struct {
	*Policy
	ov  *Overrides
	now func() time.Time
}

// NewWithOverrides combines p and ov (nil = none); now is the clock that
// expiry is judged by (nil = time.Now). ov must not change afterwards.
func NewWithOverrides(p *Policy, ov *Overrides, now func() time.Time) *WithOverrides {
	if ov == nil {
		ov = NewOverrides(0)
	}
	if now == nil {
		now = time.Now
	}
	return &WithOverrides{Policy: p, ov: ov, now: now}
}

// Overrides is the set in force.
func (w *WithOverrides) Overrides() *Overrides { return w.ov }

// Resolve implements enforcement.Policy: the override of (key, scope), else
// of key, when one is in force now, else the document's resolution. The
// clock is read only when an override of the key has an expiry.
func (w *WithOverrides) Resolve(key, scope, tier string) (limits.Resolved, error) {
	scoped, own := w.ov.find(key, scope)
	if scoped == nil && own == nil {
		return w.Policy.Resolve(key, scope, tier)
	}
	var now int64
	if (scoped != nil && scoped.expires != 0) || (own != nil && own.expires != 0) {
		now = w.now().UnixNano()
	}
	c := inForce(scoped, own, now)
	res, err := w.resolve(c, key, scope, tier)
	return w.ov.route(regionScoped(res, c, own, now), err, own, now), err
}

// ResolveAt is Resolve judged at now. An override naming a tier resolves as
// if the request had that tier, with no rule applied (it is ahead of every
// rule); one with a rate and burst replaces the limit of the request's own
// tier. Its Policy is "override:<key>". global_ceiling caps both. The
// store is the whole key's override's, else the document's (the key's
// entry, else the tier's); an override that sets only a store leaves the
// document's resolution as it is.
func (w *WithOverrides) ResolveAt(key, scope, tier string, now time.Time) (limits.Resolved, error) {
	at := now.UnixNano()
	scoped, own := w.ov.find(key, scope)
	c := inForce(scoped, own, at)
	res, err := w.resolve(c, key, scope, tier)
	return w.ov.route(regionScoped(res, c, own, at), err, own, at), err
}

// regionScoped is res with the region scope of the override in force c,
// else of the whole key's override own when in force, else as resolved.
func regionScoped(res limits.Resolved, c, own *entry, now int64) limits.Resolved {
	if c != nil && c.region != 0 {
		res.Global = c.region == regionGlobal
	} else if own != nil && own.region != 0 && (own.expires == 0 || now < own.expires) {
		res.Global = own.region == regionGlobal
	}
	return res
}

// inForce is the override that applies at now: the key-and-scope one
// first, else the key's own; an expired one is skipped (nil: none).
func inForce(scoped, own *entry, now int64) *entry {
	if scoped != nil && (scoped.expires == 0 || now < scoped.expires) {
		return scoped
	}
	if own != nil && (own.expires == 0 || now < own.expires) {
		return own
	}
	return nil
}

// resolve is the resolution of (key, scope, tier) under the override c
// (nil: the document's).
func (w *WithOverrides) resolve(c *entry, key, scope, tier string) (limits.Resolved, error) {
	if c == nil || (c.tier == 0 && c.rate == 0 && c.quota == 0) { // none, or a store or concurrency only
		res, err := w.Policy.Resolve(key, scope, tier)
		if c != nil && c.conc > 0 {
			res.Concurrency = int64(c.conc)
		}
		return res, err
	}
	if c.tier != 0 {
		tier = w.ov.tierName(c.tier)
	} else if tier == "" {
		tier = w.file.Keys[key]
		if tier == "" {
			tier = w.file.DefaultTier
		}
	}
	tl, found := w.tiers[tier]
	if !found {
		return limits.Resolved{}, fmt.Errorf("%w %q", limits.ErrUnknownTier, tier)
	}
	res := limits.Resolved{Limit: tl.limit, Policy: "override:" + key, Tier: tier, DryRun: w.file.DryRun, Cost: 1}
	if cost, ok := w.file.Costs[scope]; ok {
		res.Cost = cost
	}
	if c.rate > 0 {
		res.Rate, res.Burst = c.rate, c.burst
	}
	if c.quota > 0 {
		res.QuotaLimit, res.QuotaPeriod, res.QuotaID = c.quota, limits.Period(c.qperiod), "override:"+key
	}
	if c.conc > 0 {
		res.Concurrency = int64(c.conc)
	}
	if cl := w.ceiling; cl != nil {
		res.Rate = min(res.Rate, cl.Rate)
		res.Burst = min(res.Burst, cl.Burst)
	}
	if st, ok := w.file.KeyStores[key]; ok {
		res.Store = st // the key's own store, whatever its tier (as Resolve)
	}
	return res, nil
}

// HasConcurrency reports whether the document or an override may resolve
// to a concurrency limit.
func (w *WithOverrides) HasConcurrency() bool { return w.ov.concurrent || w.Policy.HasConcurrency() }

// Stores is every store name the document or an override routes keys to
// (sorted; the default store not included).
func (w *WithOverrides) Stores() []string {
	seen := map[string]bool{}
	var out []string
	for _, list := range [][]string{w.Policy.Stores(), w.ov.Stores()} {
		for _, st := range list {
			if !seen[st] {
				seen[st] = true
				out = append(out, st)
			}
		}
	}
	slices.Sort(out)
	return out
}
