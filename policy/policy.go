// Package policy reads the policy file (YAML; see docs/policy.md)
// into an immutable, validated Policy that resolves the limit of any
// (key, scope, tier) in the documented order.
package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/ratewarden/ratewarden/limits"
)

// File is the policy file as written. Field names are the file's.
type File struct {
	Version       int               `yaml:"version"`
	DefaultTier   string            `yaml:"default_tier"`
	DryRun        bool              `yaml:"dry_run"`
	GlobalCeiling *Ceiling          `yaml:"global_ceiling"`
	Tiers         map[string]Tier   `yaml:"tiers"`
	Rules         []Rule            `yaml:"rules"`
	Costs         map[string]int64  `yaml:"costs"`
	Keys          map[string]string `yaml:"keys"` // key → tier, from either form of an entry
	// KeyStores is the store of each key whose entry names one (the form
	// `acct_acme: { tier: enterprise, store: acme }`).
	KeyStores map[string]string `yaml:"-"`
	// Domains maps Envoy rate limit descriptors to keys and scopes, per
	// domain (see domains.go).
	Domains map[string]Domain `yaml:"domains"`
	// Priorities are the priority classes of concurrency limits, each with
	// its share of a key's slots (0 < share ≤ 1): a request of a class may
	// take a slot only while fewer than share × concurrency are held (see
	// docs/concurrency.md). Empty = the classes critical, default and
	// sheddable, each with the whole capacity (no shedding).
	Priorities map[string]float64 `yaml:"priorities"`
}

// Ceiling caps whatever resolves.
type Ceiling struct {
	Rate   float64 `yaml:"rate"`
	Period string  `yaml:"period"`
	Burst  int64   `yaml:"burst"`
}

// Tier is a named limit.
type Tier struct {
	Rate             float64 `yaml:"rate"`
	Period           string  `yaml:"period"` // second (default), minute, hour, day
	Burst            int64   `yaml:"burst"`
	SoftLimitPercent float64 `yaml:"soft_limit_percent"`
	Quota            *Quota  `yaml:"quota"`
	// Unit names what the tier's cost counts ("tokens", "bytes"), for the
	// usage API and the dashboard; "" counts requests' costs, unnamed.
	Unit string `yaml:"unit"`
	// Store routes the tier's keys to a named store (REDIS_STORES); a
	// key's own entry in the keys map wins over it.
	Store string `yaml:"store"`
	// Scope is global (one limit shared by every region) or regional
	// (each region enforces it on its own: the default).
	Scope string `yaml:"scope"`
	// Concurrency bounds the requests of a key (and scope) in flight at
	// once, fleet-wide; 0 = none. A tier may have it alone (no rate, no
	// burst) or beside them.
	Concurrency int64 `yaml:"concurrency"`
}

// KeyEntry is the long form of a keys map entry.
type KeyEntry struct {
	Tier  string `yaml:"tier"`
	Store string `yaml:"store"` // a named store (REDIS_STORES); "" = the tier's
}

// Quota is a calendar-window allowance.
type Quota struct {
	Limit  int64  `yaml:"limit"`
	Period string `yaml:"period"` // hour, day, month (UTC)
	// UnknownWhileDegraded: what a key whose use in the window this
	// instance never heard from the store may spend while the store is
	// down: "share" (default: the quota ÷ instances) or "deny" (nothing).
	UnknownWhileDegraded string `yaml:"unknown_while_degraded"`
}

// Rule overrides the tier's limit for the requests it matches. Every matcher
// is optional; a field left out is inherited from the tier.
type Rule struct {
	Name      string `yaml:"name"`
	Key       string `yaml:"key"`
	KeyPrefix string `yaml:"key_prefix"`
	Tier      string `yaml:"tier"`
	Scope     string `yaml:"scope"` // exact, or a glob with *

	Rate             *float64 `yaml:"rate"`
	Period           string   `yaml:"period"`
	Burst            *int64   `yaml:"burst"`
	SoftLimitPercent *float64 `yaml:"soft_limit_percent"`
	Quota            *Quota   `yaml:"quota"`
	Unit             string   `yaml:"unit"` // as Tier.Unit; "" = the tier's
	DryRun           bool     `yaml:"dry_run"`
	// Split spreads each matching key over this many sub-buckets (hot keys).
	Split int `yaml:"split"`
	// Shadow: the rule is evaluated beside the enforced one, in its own
	// bucket state, and reported, never enforced (see shadow.go).
	Shadow bool `yaml:"shadow"`
	// RegionScope is global or regional, as a tier's scope; empty =
	// the tier's. A rule's scope already matches the request's scope,
	// hence the longer name.
	RegionScope string `yaml:"region_scope"`
	// Concurrency replaces the tier's concurrency limit; 0 removes it.
	Concurrency *int64 `yaml:"concurrency"`
}

// Policy is a validated policy file, ready to resolve limits. It is
// immutable and safe for concurrent use.
type Policy struct {
	file    File
	hash    string
	tiers   map[string]tierLimit
	rules   []compiledRule
	ceiling *limits.Limit
	domains map[string]compiledDomain
	// hasShadow: some rule is marked shadow, so decisions need a shadow
	// resolution (none is attempted otherwise).
	hasShadow bool
	// priorities is each priority class's share (priority.go).
	priorities map[string]float64
}

type tierLimit struct {
	name   string
	limit  limits.Limit
	global bool // scope: global
}

// Region scopes: what a tier's scope, a rule's region_scope and an
// override's scope may say ("" = regional for a tier, inherited for a
// rule or an override).
const (
	ScopeGlobal   = "global"
	ScopeRegional = "regional"
)

type compiledRule struct {
	Rule
	index     int
	scopeGlob bool
}

// Stores is every store name the policy routes keys to (sorted; the
// default store, "", not included). A limiter refuses a policy naming a
// store it does not have (cmd/limiter: REDIS_STORES).
func (p *Policy) Stores() []string {
	seen := map[string]bool{}
	for _, t := range p.file.Tiers {
		if t.Store != "" {
			seen[t.Store] = true
		}
	}
	for _, st := range p.file.KeyStores {
		seen[st] = true
	}
	out := make([]string, 0, len(seen))
	for st := range seen {
		out = append(out, st)
	}
	sort.Strings(out)
	return out
}

// CheckStores reports every store the policy names that known (the
// configured names) lacks, each with where the policy names it.
func (p *Policy) CheckStores(known func(name string) bool) error {
	var errs []string
	for name, t := range p.file.Tiers {
		if t.Store != "" && !known(t.Store) {
			errs = append(errs, fmt.Sprintf("tiers.%s.store: names store %q, which is not configured", name, t.Store))
		}
	}
	for key, st := range p.file.KeyStores {
		if !known(st) {
			errs = append(errs, fmt.Sprintf("keys.%s.store: names store %q, which is not configured", key, st))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.Strings(errs)
	return fmt.Errorf("%s (REDIS_STORES names the stores)", strings.Join(errs, "; "))
}

// Version is the file's version field.
func (p *Policy) Version() int { return p.file.Version }

// Hash is the SHA-256 of the file's bytes, hex-encoded.
func (p *Policy) Hash() string { return p.hash }

// File returns the policy as written (for explain and tools).
func (p *Policy) File() File { return p.file }

func hashOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

var periodSeconds = map[string]float64{"": 1, "second": 1, "minute": 60, "hour": 3600, "day": 86400}

var quotaPeriods = map[string]limits.Period{
	"hour": limits.PeriodHour, "day": limits.PeriodDay, "month": limits.PeriodMonth,
}

// Resolve implements enforcement.Policy (and is the one resolution the
// usage API reports against). The order, most specific first:
// the tier is the request's, else the keys map's, else default_tier; among
// the rules that match, exact key > key_prefix > tier > no key matcher, and
// within that exact scope > glob scope > no scope; ties go to the rule listed
// first; no rule → the tier's own limit. global_ceiling then caps rate and
// burst.
func (p *Policy) Resolve(key, scope, tier string) (limits.Resolved, error) {
	res, _, err := p.resolve(key, scope, tier, false)
	return res, err
}

// resolve is Resolve; withShadow lets shadow rules compete too (shadow.go).
// It also returns the winning rule (nil = the tier's own limit).
func (p *Policy) resolve(key, scope, tier string, withShadow bool) (limits.Resolved, *compiledRule, error) {
	if tier == "" {
		tier = p.file.Keys[key]
		if tier == "" {
			tier = p.file.DefaultTier
		}
	}
	tl, ok := p.tiers[tier]
	if !ok {
		return limits.Resolved{}, nil, fmt.Errorf("%w %q", limits.ErrUnknownTier, tier)
	}
	res := limits.Resolved{Limit: tl.limit, Policy: tier, Tier: tier, DryRun: p.file.DryRun, Cost: 1, Global: tl.global, Unit: p.file.Tiers[tier].Unit}
	if c, ok := p.file.Costs[scope]; ok {
		res.Cost = c
	}
	r := p.bestRule(key, scope, tier, withShadow)
	if r != nil {
		res.Policy = r.Name
		if r.RegionScope != "" {
			res.Global = r.RegionScope == ScopeGlobal
		}
		res.DryRun = res.DryRun || r.DryRun
		if r.Rate != nil {
			res.Rate = *r.Rate / periodSeconds[r.Period]
		}
		if r.Burst != nil {
			res.Burst = *r.Burst
		}
		if r.SoftLimitPercent != nil {
			res.SoftLimitPercent = *r.SoftLimitPercent
		}
		if r.Quota != nil {
			res.QuotaLimit, res.QuotaPeriod, res.QuotaID = r.Quota.Limit, quotaPeriods[r.Quota.Period], "rule:"+r.Name
			res.QuotaDenyUnknown = r.Quota.UnknownWhileDegraded == "deny"
		}
		res.Split = r.Split
		if r.Concurrency != nil {
			res.Concurrency = *r.Concurrency
		}
		if r.Unit != "" {
			res.Unit = r.Unit
		}
	}
	if c := p.ceiling; c != nil {
		res.Rate = min(res.Rate, c.Rate)
		res.Burst = min(res.Burst, c.Burst)
	}
	if st, ok := p.file.KeyStores[key]; ok {
		res.Store = st // the key's own store, whatever its tier
	}
	return res, r, nil
}

// Matches returns the rule that wins for (key, scope, tier) and every rule
// that matched, in file order (for `limiter policy explain`).
func (p *Policy) Matches(key, scope, tier string) (winner *Rule, matched []Rule) {
	if tier == "" {
		tier = p.file.Keys[key]
		if tier == "" {
			tier = p.file.DefaultTier
		}
	}
	var best *compiledRule
	for i := range p.rules {
		r := &p.rules[i]
		if r.matches(key, scope, tier) {
			matched = append(matched, r.Rule)
			if !r.Shadow && (best == nil || r.rank() > best.rank()) { // a shadow rule is never enforced
				best = r
			}
		}
	}
	if best != nil {
		winner = &best.Rule
	}
	return winner, matched
}

// bestRule is the winning rule. Shadow rules take part only withShadow,
// and then win ties against enforced rules of the same specificity: a
// shadow rule answers "what if this rule were enforced instead".
func (p *Policy) bestRule(key, scope, tier string, withShadow bool) *compiledRule {
	var best *compiledRule
	bestRank := -1
	for i := range p.rules {
		r := &p.rules[i]
		if r.Shadow && !withShadow {
			continue
		}
		if !r.matches(key, scope, tier) {
			continue
		}
		rank := r.rank() * 2
		if r.Shadow {
			rank++
		}
		if rank > bestRank {
			best, bestRank = r, rank // strictly greater: ties keep the rule listed first
		}
	}
	return best
}

func (r *compiledRule) matches(key, scope, tier string) bool {
	if r.Key != "" && r.Key != key {
		return false
	}
	if r.KeyPrefix != "" && !strings.HasPrefix(key, r.KeyPrefix) {
		return false
	}
	if r.Tier != "" && r.Tier != tier {
		return false
	}
	if r.Scope != "" {
		if r.scopeGlob {
			return globMatch(r.Scope, scope)
		}
		return r.Scope == scope
	}
	return true
}

// rank orders rules by specificity: the key matcher first, then the scope.
func (r *compiledRule) rank() int {
	keyRank := 0
	switch {
	case r.Key != "":
		keyRank = 3
	case r.KeyPrefix != "":
		keyRank = 2
	case r.Tier != "":
		keyRank = 1
	}
	scopeRank := 0
	switch {
	case r.Scope != "" && !r.scopeGlob:
		scopeRank = 2
	case r.Scope != "":
		scopeRank = 1
	}
	return keyRank*3 + scopeRank
}

// globMatch reports whether s matches pattern, where * matches any run of
// bytes (including none) and every other byte matches itself.
func globMatch(pattern, s string) bool {
	// Iterative matcher with one backtrack point: linear in practice.
	p, i, star, mark := 0, 0, -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// Warnings lists what is valid but almost certainly not meant: rules that
// can never win because an earlier rule has the same matchers (ties go to
// the first listed), and scopes whose cost exceeds every burst they can
// resolve to. `limiter policy check` prints them; they refuse nothing.
func (p *Policy) Warnings() []string {
	var out []string
	first := map[[5]string]string{}
	for _, r := range p.rules {
		// Shadow rules compete among themselves: one that shares an
		// enforced rule's matchers is the usual trial of a new limit.
		m := [5]string{r.Key, r.KeyPrefix, r.Tier, r.Scope, fmt.Sprint(r.Shadow)}
		if earlier, ok := first[m]; ok {
			out = append(out, fmt.Sprintf("rules[%d] %q can never win: %q has the same matchers and is listed first", r.index, r.Name, earlier))
			continue
		}
		first[m] = r.Name
	}
	maxBurst := int64(0)
	for _, t := range p.tiers {
		maxBurst = max(maxBurst, t.limit.Burst)
	}
	for _, r := range p.rules {
		if r.Burst != nil {
			maxBurst = max(maxBurst, *r.Burst)
		}
	}
	if p.ceiling != nil {
		maxBurst = min(maxBurst, p.ceiling.Burst)
	}
	scopes := make([]string, 0, len(p.file.Costs))
	for s := range p.file.Costs {
		scopes = append(scopes, s)
	}
	sort.Strings(scopes)
	for _, s := range scopes {
		if c := p.file.Costs[s]; c > maxBurst {
			out = append(out, fmt.Sprintf("costs[%q] = %d exceeds every burst (at most %d): requests without a cost are always refused with cost_exceeds_limit", s, c, maxBurst))
		}
	}
	return out
}
