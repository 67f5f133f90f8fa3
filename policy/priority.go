package policy

import (
	"math"
	"sort"
	"strings"

	"github.com/ratewarden/ratewarden/limits"
)

// The priority classes a policy without a priorities section knows, each
// with the whole capacity: a request may name one, and nothing is shed.
const (
	PriorityCritical  = "critical"
	PriorityDefault   = "default"
	PrioritySheddable = "sheddable"
)

// DefaultPriority is the class of a request that names none.
const DefaultPriority = PriorityDefault

// PriorityShare is the share of a concurrency limit's slots that requests
// of priority class name may hold (0 < share ≤ 1): a request of the class
// is admitted only while fewer than ⌊share × concurrency⌋ slots are held
// (at least one). "" is DefaultPriority. ok is false for a class the
// policy does not define.
func (p *Policy) PriorityShare(name string) (share float64, ok bool) {
	if name == "" {
		name = DefaultPriority
	}
	share, ok = p.priorities[name]
	return share, ok
}

// Sheds reports whether some class has a share below 1: then the classes
// of share 1 hold capacity the others cannot take (a guarantee).
func (p *Policy) Sheds() bool {
	for _, share := range p.priorities {
		if share < 1 {
			return true
		}
	}
	return false
}

// Priorities is every class with its share, sorted by name.
func (p *Policy) Priorities() []string {
	out := make([]string, 0, len(p.priorities))
	for name := range p.priorities {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// HasConcurrency reports whether any tier, rule or override may resolve
// to a concurrency limit: when none can, a decision needs no slot and
// the slot layer (enforcement/slots) passes it straight on.
func (p *Policy) HasConcurrency() bool {
	for _, t := range p.file.Tiers {
		if t.Concurrency > 0 {
			return true
		}
	}
	for _, r := range p.rules {
		if r.Concurrency != nil && *r.Concurrency > 0 {
			return true
		}
	}
	return false
}

// priorities checks the priorities section and returns the shares in
// force: the section's, or the built-in classes at share 1 without one.
func (v *validator) priorities(in map[string]float64) map[string]float64 {
	if len(in) == 0 {
		return map[string]float64{PriorityCritical: 1, PriorityDefault: 1, PrioritySheddable: 1}
	}
	names := make([]string, 0, len(in))
	for name := range in {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		path := "priorities." + name
		if strings.TrimSpace(name) == "" || len(name) > limits.MaxTierBytes {
			v.fail(path, "a priority class needs a name of 1 to %d bytes", limits.MaxTierBytes)
		}
		if share := in[name]; !(share > 0 && share <= 1) || math.IsNaN(share) {
			v.fail(path, "a share must be > 0 and ≤ 1 (the fraction of a concurrency limit the class may hold), got %v", share)
		}
	}
	if _, ok := in[DefaultPriority]; !ok {
		v.fail("priorities", "must define %q, the class of a request that names none", DefaultPriority)
	}
	return in
}
