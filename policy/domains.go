package policy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ratewarden/ratewarden/limits"
)

// Domain maps the descriptors of one Envoy rate limit domain (the `domain`
// of a RateLimitRequest) onto the (key, scope) pairs the rest of the file
// limits. A descriptor becomes a key and a scope, then resolves exactly as
// a /check of that key and scope would: same tiers, rules, order, costs,
// dry run and soft limits.
type Domain struct {
	Descriptors []DescriptorMap `yaml:"descriptors"`
}

// DescriptorMap is one way a descriptor becomes a key and a scope.
type DescriptorMap struct {
	// Name is optional; explain and the docs use it.
	Name string `yaml:"name"`
	// Match lists the descriptor's entry keys, in order: a descriptor
	// matches when its entries have exactly these keys in this order. An
	// item "name=value" also requires that value.
	Match []string `yaml:"match"`
	// Key and Scope are templates: {name} is the value of the entry named
	// name; everything else is literal. Both are required.
	Key   string `yaml:"key"`
	Scope string `yaml:"scope"`
	// Tier is optional: the tier of every decision of this mapping, as a
	// /check's `tier` field; empty = the keys map, else default_tier.
	Tier string `yaml:"tier"`
}

// Entry is one key/value entry of a descriptor.
type Entry struct{ Key, Value string }

// Mapped is what a descriptor became.
type Mapped struct {
	Key, Scope, Tier string
	// Index is the position of the mapping in its domain's descriptors list.
	Index int
	// Name is the mapping's name, or "descriptors[Index]".
	Name string
}

// MapResult says whether a descriptor could be mapped.
type MapResult uint8

// Results of MapDescriptor.
const (
	MapOK            MapResult = iota // the descriptor became a key and a scope
	MapUnknownDomain                  // the file has no such domain
	MapNoMatch                        // the domain has no mapping whose match fits the descriptor
)

type compiledDomain struct {
	maps []compiledMap
}

type compiledMap struct {
	DescriptorMap
	name         string
	names        []string // entry keys, in order
	values       []string // required values ("" = any)
	valueSet     []bool
	key, scope   []segment
	literalBytes [2]int // bytes of the key's and the scope's literal parts
}

// segment is a literal (entry < 0) or the value of entry number entry.
type segment struct {
	lit   string
	entry int
}

// Domains returns the names of the domains the file defines.
func (p *Policy) Domains() []string {
	out := make([]string, 0, len(p.domains))
	for name := range p.domains {
		out = append(out, name)
	}
	return out
}

// HasDomain reports whether the file defines domain.
func (p *Policy) HasDomain(domain string) bool {
	_, ok := p.domains[domain]
	return ok
}

// MapDescriptor turns a descriptor of domain into a key, a scope and a
// tier: the first mapping of the domain, in file order, whose match fits
// the entries wins.
func (p *Policy) MapDescriptor(domain string, entries []Entry) (Mapped, MapResult) {
	d, ok := p.domains[domain]
	if !ok {
		return Mapped{}, MapUnknownDomain
	}
	for i := range d.maps {
		m := &d.maps[i]
		if !m.matches(entries) {
			continue
		}
		return Mapped{
			Key:   m.expand(m.key, m.literalBytes[0], entries),
			Scope: m.expand(m.scope, m.literalBytes[1], entries),
			Tier:  m.Tier, Index: i, Name: m.name,
		}, MapOK
	}
	return Mapped{}, MapNoMatch
}

func (m *compiledMap) matches(entries []Entry) bool {
	if len(entries) != len(m.names) {
		return false
	}
	for i, e := range entries {
		if e.Key != m.names[i] || (m.valueSet[i] && e.Value != m.values[i]) {
			return false
		}
	}
	return true
}

func (m *compiledMap) expand(segs []segment, literal int, entries []Entry) string {
	if len(segs) == 1 {
		if segs[0].entry < 0 {
			return segs[0].lit
		}
		return entries[segs[0].entry].Value
	}
	n := literal
	for _, s := range segs {
		if s.entry >= 0 {
			n += len(entries[s.entry].Value)
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, s := range segs {
		if s.entry < 0 {
			b.WriteString(s.lit)
		} else {
			b.WriteString(entries[s.entry].Value)
		}
	}
	return b.String()
}

// Limits of a mapping's templates: what /check accepts.
const (
	maxKeyBytes   = limits.MaxKeyBytes
	maxScopeBytes = limits.MaxScopeBytes
)

// domains validates and compiles the domains section.
func (v *validator) domains(f File) map[string]compiledDomain {
	out := make(map[string]compiledDomain, len(f.Domains))
	for name, d := range f.Domains {
		path := "domains." + name
		if strings.TrimSpace(name) == "" {
			v.fail(path, "a domain needs a name")
		}
		if len(d.Descriptors) == 0 {
			v.fail(path+".descriptors", "at least one descriptor mapping is required")
		}
		cd := compiledDomain{}
		seen := map[string]int{}
		for i, m := range d.Descriptors {
			mp := fmt.Sprintf("%s.descriptors[%d]", path, i)
			cm := compiledMap{DescriptorMap: m, name: m.Name}
			if cm.name == "" {
				cm.name = fmt.Sprintf("descriptors[%d]", i)
			}
			if len(m.Match) == 0 {
				v.fail(mp+".match", "at least one entry key is required")
			}
			index := map[string]int{}
			for j, item := range m.Match {
				k, val, hasVal := strings.Cut(item, "=")
				if k == "" {
					v.fail(fmt.Sprintf("%s.match[%d]", mp, j), "an entry key is required, got %q", item)
				}
				if _, dup := index[k]; dup {
					v.fail(fmt.Sprintf("%s.match[%d]", mp, j), "entry key %q is listed twice", k)
				}
				index[k] = j
				cm.names = append(cm.names, k)
				cm.values = append(cm.values, val)
				cm.valueSet = append(cm.valueSet, hasVal)
			}
			var lit int
			cm.key, lit = v.template(mp+".key", m.Key, index, maxKeyBytes)
			cm.literalBytes[0] = lit
			cm.scope, lit = v.template(mp+".scope", m.Scope, index, maxScopeBytes)
			cm.literalBytes[1] = lit
			if m.Tier != "" {
				if _, ok := f.Tiers[m.Tier]; !ok {
					v.fail(mp+".tier", "names tier %q, which is not defined", m.Tier)
				}
			}
			sig := strings.Join(m.Match, "\x00")
			if j, dup := seen[sig]; dup && len(m.Match) > 0 {
				v.fail(mp+".match", "is the same as descriptors[%d]'s: this mapping could never match (the first that matches wins)", j)
			} else {
				seen[sig] = i
			}
			cd.maps = append(cd.maps, cm)
		}
		out[name] = cd
	}
	return out
}

// template compiles a key or scope template: {name} names an entry of the
// match list. It returns the segments and the bytes of the literal parts.
func (v *validator) template(path, t string, index map[string]int, maxBytes int) ([]segment, int) {
	if t == "" {
		v.fail(path, "is required (a template such as \"ip:{remote_address}\")")
		return []segment{{lit: "", entry: -1}}, 0
	}
	var segs []segment
	literal := 0
	rest := t
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			segs = append(segs, segment{lit: rest, entry: -1})
			literal += len(rest)
			break
		}
		if rest[open] == '}' {
			v.fail(path, "has a } with no { before it: %q", t)
			return []segment{{lit: t, entry: -1}}, len(t)
		}
		if open > 0 {
			segs = append(segs, segment{lit: rest[:open], entry: -1})
			literal += open
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			v.fail(path, "has a { that is not closed: %q", t)
			return []segment{{lit: t, entry: -1}}, len(t)
		}
		name := rest[open+1 : open+end]
		i, ok := index[name]
		if !ok {
			v.fail(path, "{%s} is not an entry key of match", name)
			i = 0
		}
		segs = append(segs, segment{entry: i})
		rest = rest[open+end+1:]
	}
	if literal > maxBytes {
		v.fail(path, "the literal part alone is %d bytes; a key is at most %d, a scope at most %d", literal, maxKeyBytes, maxScopeBytes)
	}
	return segs, literal
}

// ExplainDescriptor describes, for an operator, how a descriptor of domain
// becomes a key and a scope (which mapping matched, and why the others did
// not), then how that key and scope resolve (Explain).
func ExplainDescriptor(p *Policy, domain string, entries []Entry) string {
	var b strings.Builder
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.Key + "=" + e.Value
	}
	fmt.Fprintf(&b, "domain %q, descriptor [%s]\n", domain, strings.Join(parts, ", "))
	m, res := p.MapDescriptor(domain, entries)
	switch res {
	case MapUnknownDomain:
		names := p.Domains()
		sort.Strings(names)
		fmt.Fprintf(&b, "unknown domain: the file defines %s\n", quoteList(names))
		b.WriteString("result: OK with no limit (nothing is spent; limiter_envoy_descriptors_total{result=\"unknown_domain\"} counts it)\n")
		return b.String()
	case MapNoMatch:
		b.WriteString("no mapping matches (a mapping matches the entry keys exactly, in order):\n")
		for _, cm := range p.domains[domain].maps {
			fmt.Fprintf(&b, "  %-24s match [%s]\n", cm.name, strings.Join(cm.Match, ", "))
		}
		b.WriteString("result: OK with no limit (nothing is spent; limiter_envoy_descriptors_total{result=\"no_match\"} counts it)\n")
		return b.String()
	}
	cm := p.domains[domain].maps[m.Index]
	fmt.Fprintf(&b, "mapping: domains.%s.descriptors[%d] %s (match [%s]; the first mapping that matches wins)\n",
		domain, m.Index, cm.name, strings.Join(cm.Match, ", "))
	fmt.Fprintf(&b, "  key   %q from %q\n  scope %q from %q\n", m.Key, cm.Key, m.Scope, cm.Scope)
	if len(m.Key) > maxKeyBytes || len(m.Scope) > maxScopeBytes {
		fmt.Fprintf(&b, "error: the key is %d bytes (at most %d) and the scope %d (at most %d): the request is refused with INVALID_ARGUMENT\n",
			len(m.Key), maxKeyBytes, len(m.Scope), maxScopeBytes)
		return b.String()
	}
	if m.Tier != "" {
		fmt.Fprintf(&b, "  tier  %s (the mapping's tier)\n", m.Tier)
	}
	b.WriteString(Explain(p, m.Key, m.Scope, m.Tier))
	return b.String()
}

func quoteList(names []string) string {
	if len(names) == 0 {
		return "no domains"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}
