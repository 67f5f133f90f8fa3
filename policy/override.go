package policy

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// Override is an operator's limit for one key, or one key in one scope,
// kept in the policy log (CONTRACT.md, "Policy control plane"). It applies
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
	case o.Tier == "" && !hasRate && o.Quota == 0 && o.Store == "":
		fail("override: sets nothing: give a tier, or a rate and burst, or a quota, or a store")
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

// compiledOverride is an Override reduced to what resolution needs, kept
// small: a million of them must fit in a few hundred megabytes.
type compiledOverride struct {
	rate    float64 // tokens per second; 0 = the tier's
	burst   int64
	quota   int64
	expires int64  // Unix nanoseconds; 0 = never
	tier    uint16 // 1 + index in Overrides.tiers; 0 = none
	store   uint16 // 1 + index in Overrides.stores; 0 = the document's routing
	qperiod limits.Period
}

// Overrides is a set of validated overrides, ready to resolve. Build it
// with NewOverrides and Put; once handed to WithOverrides it must not be
// changed (it is then read by concurrent decisions without a lock).
type Overrides struct {
	m     map[OverrideKey]compiledOverride
	tiers []string // the tier names overrides use, interned
	// stores are the store names overrides route to, interned; routed[i]
	// counts the overrides naming stores[i] (Stores lists those in use),
	// and routing their sum, so that resolution looks for a key's store
	// only when some override routes one.
	stores  []string
	routed  []int
	routing int
}

// NewOverrides returns an empty set with room for n overrides.
func NewOverrides(n int) *Overrides {
	return &Overrides{m: make(map[OverrideKey]compiledOverride, n)}
}

// tierIndex interns a tier name (1-based; 0 = none). Tiers are few.
func (s *Overrides) tierIndex(name string) uint16 {
	if name == "" {
		return 0
	}
	for i, t := range s.tiers {
		if t == name {
			return uint16(i + 1)
		}
	}
	s.tiers = append(s.tiers, name)
	return uint16(len(s.tiers))
}

func (s *Overrides) tierName(i uint16) string {
	if i == 0 {
		return ""
	}
	return s.tiers[i-1]
}

// storeIndex interns a store name (1-based; 0 = none). Stores are few.
func (s *Overrides) storeIndex(name string) uint16 {
	if name == "" {
		return 0
	}
	for i, t := range s.stores {
		if t == name {
			return uint16(i + 1)
		}
	}
	s.stores = append(s.stores, name)
	s.routed = append(s.routed, 0)
	return uint16(len(s.stores))
}

func (s *Overrides) storeName(i uint16) string {
	if i == 0 {
		return ""
	}
	return s.stores[i-1]
}

// count adds d to the routing counts of c's store.
func (s *Overrides) count(c compiledOverride, d int) {
	if c.store != 0 {
		s.routed[c.store-1] += d
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
	sort.Strings(out)
	return out
}

// Len is the number of overrides in the set.
func (s *Overrides) Len() int { return len(s.m) }

// Put adds or replaces the override of k. o must be valid (Validate).
func (s *Overrides) Put(k OverrideKey, o Override) {
	c := compiledOverride{tier: s.tierIndex(o.Tier), store: s.storeIndex(o.Store), burst: o.Burst, quota: o.Quota, qperiod: quotaPeriods[o.QuotaPeriod]}
	if o.Rate > 0 {
		c.rate = o.Rate / periodSeconds[o.Period]
	}
	if !o.Expires.IsZero() {
		c.expires = o.Expires.UnixNano()
	}
	if old, ok := s.m[k]; ok {
		s.count(old, -1)
	}
	s.count(c, 1)
	s.m[k] = c
}

// Delete removes the override of k.
func (s *Overrides) Delete(k OverrideKey) {
	if old, ok := s.m[k]; ok {
		s.count(old, -1)
		delete(s.m, k)
	}
}

// Clone returns a copy of s that can be changed without touching s.
func (s *Overrides) Clone() *Overrides {
	c := &Overrides{m: make(map[OverrideKey]compiledOverride, len(s.m)), tiers: append([]string(nil), s.tiers...),
		stores: append([]string(nil), s.stores...), routed: append([]int(nil), s.routed...), routing: s.routing}
	for k, v := range s.m {
		c.m[k] = v
	}
	return c
}

// lookup returns the override in force for (key, scope) at now: the
// key-and-scope one first, else the key's own; an expired one is skipped.
func (s *Overrides) lookup(key, scope string, now int64) (compiledOverride, bool) {
	if len(s.m) == 0 {
		return compiledOverride{}, false
	}
	if c, ok := s.m[OverrideKey{key, scope}]; ok && (c.expires == 0 || now < c.expires) {
		return c, true
	}
	if c, ok := s.m[OverrideKey{Key: key}]; ok && (c.expires == 0 || now < c.expires) {
		return c, true
	}
	return compiledOverride{}, false
}

// storeOf is the store the override of the whole key routes it to at now
// ("" = none: the document's routing).
func (s *Overrides) storeOf(key string, now int64) string {
	if s.routing == 0 {
		return ""
	}
	if c, ok := s.m[OverrideKey{Key: key}]; ok && c.store != 0 && (c.expires == 0 || now < c.expires) {
		return s.storeName(c.store)
	}
	return ""
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
// of key, when one is in force at now, else the document's resolution.
func (w *WithOverrides) Resolve(key, scope, tier string) (limits.Resolved, error) {
	return w.ResolveAt(key, scope, tier, w.now())
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
	c, ok := w.ov.lookup(key, scope, at)
	if !ok || (c.tier == 0 && c.rate == 0 && c.quota == 0) {
		res, err := w.Policy.Resolve(key, scope, tier)
		if st := w.ov.storeOf(key, at); st != "" && err == nil {
			res.Store = st
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
		res.QuotaLimit, res.QuotaPeriod, res.QuotaID = c.quota, c.qperiod, "override:"+key
	}
	if cl := w.ceiling; cl != nil {
		res.Rate = min(res.Rate, cl.Rate)
		res.Burst = min(res.Burst, cl.Burst)
	}
	if st, ok := w.file.KeyStores[key]; ok {
		res.Store = st // the key's own store, whatever its tier (as Resolve)
	}
	if st := w.ov.storeOf(key, at); st != "" {
		res.Store = st
	}
	return res, nil
}

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
	sort.Strings(out)
	return out
}

// MissingTiers lists the overrides that name a tier p does not define, as
// "override <key>[ scope <scope>] names tier <tier>", sorted.
func (s *Overrides) MissingTiers(p *Policy) []string {
	var out []string
	for k, c := range s.m {
		name := s.tierName(c.tier)
		if name == "" {
			continue
		}
		if _, ok := p.tiers[name]; !ok {
			what := "override " + k.Key
			if k.Scope != "" {
				what += " scope " + k.Scope
			}
			out = append(out, fmt.Sprintf("%s names tier %q", what, name))
		}
	}
	sort.Strings(out)
	return out
}

// Each calls fn for every override of the set, in no order, as an Override
// that Put would compile to the same entry (its rate per second, without
// its reason).
func (s *Overrides) Each(fn func(OverrideKey, Override)) {
	for k, c := range s.m {
		o := Override{Tier: s.tierName(c.tier), Store: s.storeName(c.store), Rate: c.rate, Burst: c.burst, Quota: c.quota}
		if c.qperiod != limits.PeriodNone {
			o.QuotaPeriod = c.qperiod.String()
		}
		if c.expires != 0 {
			o.Expires = time.Unix(0, c.expires).UTC()
		}
		fn(k, o)
	}
}
