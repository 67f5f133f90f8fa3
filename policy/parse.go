package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ratewarden/ratewarden/limits"
)

// MaxFileSize bounds a policy file; a larger one is refused.
const MaxFileSize = 4 << 20

// maxNodes bounds the YAML nodes visited while validating, aliases
// expanded: a small file of nested aliases ("billion laughs") is refused
// instead of exhausting memory.
const maxNodes = 200_000

// maxRefill bounds how long an empty bucket may take to refill (burst ÷
// rate): beyond it the Redis script's millisecond arithmetic loses its
// integers, and no real limit needs more.
const maxRefill = 10 * 365 * 24 * 3600.0 // seconds, ten years

// Load reads and validates the policy file at path.
func Load(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	return p, nil
}

// Parse validates a policy file. Every problem is reported at once, in file
// order, each with the field's path and line, e.g.
// `tiers.pro.burst (line 7): must be between 1 and 2^50, got 0`.
// The returned error's message is never empty.
func Parse(b []byte) (*Policy, error) {
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("policy file is %d bytes, more than %d", len(b), MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("policy file is empty")
		}
		return nil, fmt.Errorf("policy is not valid YAML: %w", err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, errors.New("policy file holds more than one YAML document (a second `---`)")
	}
	if len(root.Content) == 0 {
		return nil, errors.New("policy file is empty")
	}
	v := validator{lines: map[string]int{}, shapeFailed: map[string]bool{}}
	v.shape(&root, reflect.TypeOf(File{}), "")
	var f File
	if err := decodeFile(&root, &f); err != nil {
		var typeErr *yaml.TypeError
		switch {
		case len(v.errs) == 0:
			return nil, fmt.Errorf("policy does not match the schema: %w", err)
		case !errors.As(err, &typeErr):
			return nil, v.err() // shape's messages say where
		}
		// A type error leaves its field at zero and decodes the rest; shape
		// has said where and why, and compile below skips those fields.
	}
	v.compiling = true
	p := v.compile(f) // after shape problems too: every problem at once
	if err := v.err(); err != nil {
		return nil, err
	}
	p.hash = hashOf(b)
	return p, nil
}

// maxProblems bounds the problems reported for one file.
const maxProblems = 50

type problem struct {
	line int
	msg  string
}

type validator struct {
	lines       map[string]int // dotted path (rules[2].burst) → line of its key
	errs        []problem
	visited     int
	shapeFailed map[string]bool // paths whose value could not be read
	compiling   bool            // past the shape walk
}

// err joins the problems found so far, in file order.
func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	sort.SliceStable(v.errs, func(i, j int) bool { return v.errs[i].line < v.errs[j].line })
	errs := make([]error, 0, min(len(v.errs), maxProblems)+1)
	for _, p := range v.errs[:min(len(v.errs), maxProblems)] {
		errs = append(errs, errors.New(p.msg))
	}
	if more := len(v.errs) - maxProblems; more > 0 {
		errs = append(errs, fmt.Errorf("... and %d more problems", more))
	}
	return errors.Join(errs...)
}

// fail reports a problem at path, located at the line of path or of its
// nearest ancestor present in the file.
func (v *validator) fail(path, format string, args ...any) {
	line := 0
	for p := path; p != ""; p = parent(p) {
		if l, ok := v.lines[p]; ok {
			line = l
			break
		}
	}
	v.failAt(path, line, format, args...)
}

func (v *validator) failAt(path string, line int, format string, args ...any) {
	if v.compiling {
		for p := path; p != ""; p = parent(p) {
			if v.shapeFailed[p] {
				return // the field, or one above it, could not be read: said already
			}
		}
	} else {
		v.shapeFailed[path] = true
	}
	where := path
	if where == "" {
		where = "policy"
	}
	if line > 0 {
		where = fmt.Sprintf("%s (line %d)", where, line)
	}
	v.errs = append(v.errs, problem{line: line, msg: where + ": " + fmt.Sprintf(format, args...)})
}

func parent(p string) string {
	if i := strings.LastIndexAny(p, ".["); i >= 0 {
		return p[:i]
	}
	return ""
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// shape checks that node n can become a value of type t: known fields only,
// no key twice, mappings, lists and scalars where they belong. It records
// the line of every key, so that later checks can point at it.
func (v *validator) shape(n *yaml.Node, t reflect.Type, path string) {
	v.visited++
	if v.visited > maxNodes {
		if v.visited == maxNodes+1 {
			v.failAt(path, n.Line, "the file expands to more than %d YAML nodes (nested aliases?)", maxNodes)
		}
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			v.shape(c, t, path)
		}
		return
	case yaml.AliasNode:
		if n.Alias != nil {
			v.shape(n.Alias, t, path)
		}
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // left empty: the zero value, which the checks below judge
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			v.failAt(path, n.Line, "must be a mapping (field: value), got %s", describeNode(n))
			return
		}
		fields, names := fieldsOf(t)
		v.mapping(n, path, map[string]int{}, func(key, val *yaml.Node, p string) {
			ft, ok := fields[key.Value]
			if !ok {
				v.failAt(p, key.Line, "unknown field; the fields here are %s", names)
				return
			}
			v.shape(val, ft, p)
		}, func(merged *yaml.Node) { v.shape(merged, t, path) })
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			v.failAt(path, n.Line, "must be a mapping, got %s", describeNode(n))
			return
		}
		v.mapping(n, path, map[string]int{}, func(_, val *yaml.Node, p string) {
			if path == "keys" && val.Kind == yaml.MappingNode {
				v.shape(val, reflect.TypeOf(KeyEntry{}), p) // the long form
				return
			}
			v.shape(val, t.Elem(), p)
		}, func(merged *yaml.Node) { v.shape(merged, t, path) })
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			v.failAt(path, n.Line, "must be a list, got %s", describeNode(n))
			return
		}
		for i, c := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			v.lines[p] = c.Line
			v.shape(c, t.Elem(), p)
		}
	default:
		if n.Kind != yaml.ScalarNode {
			v.failAt(path, n.Line, "must be %s, got %s", kindName(t), describeNode(n))
			return
		}
		if !scalarFits(n, t) || (t.Kind() != reflect.String && n.Decode(reflect.New(t).Interface()) != nil) {
			v.failAt(path, n.Line, "must be %s, got %q", kindName(t), truncate(n.Value, 40))
		}
	}
}

// decodeFile decodes the document into f. The keys and costs maps, which
// may hold many thousands of entries, are read here in linear time: yaml.v3
// checks each mapping key against all the earlier ones, which made a
// 50,000-key map take seconds per reload. Duplicates were reported by shape.
func decodeFile(root *yaml.Node, f *File) (err error) {
	defer func() {
		// yaml.v3 panics on some malformed merges (an alias or mapping as
		// a key next to <<); shape has reported those already.
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot decode: %v", r)
		}
	}()
	top := root
	if top.Kind == yaml.DocumentNode && len(top.Content) == 1 {
		top = top.Content[0]
	}
	if top.Kind != yaml.MappingNode {
		return root.Decode(f)
	}
	rest := *top
	rest.Content = make([]*yaml.Node, 0, len(top.Content))
	var keys, costs *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		switch k := top.Content[i]; {
		case k.Kind == yaml.ScalarNode && k.ShortTag() != "!!merge" && k.Value == "keys":
			keys = top.Content[i+1]
		case k.Kind == yaml.ScalarNode && k.ShortTag() != "!!merge" && k.Value == "costs":
			costs = top.Content[i+1]
		default:
			rest.Content = append(rest.Content, top.Content[i], top.Content[i+1])
		}
	}
	err = rest.Decode(f)
	if keys != nil {
		f.Keys = map[string]string{}
		eachPair(keys, 0, func(k string, v *yaml.Node) {
			switch {
			case v.Kind == yaml.MappingNode:
				var e KeyEntry
				if v.Decode(&e) == nil {
					f.Keys[k] = e.Tier
					if e.Store != "" {
						if f.KeyStores == nil {
							f.KeyStores = map[string]string{}
						}
						f.KeyStores[k] = e.Store
					}
				}
			case v.Kind != yaml.ScalarNode:
			case v.ShortTag() == "!!null":
				f.Keys[k] = "" // as yaml.v3 reads it; refused as an undefined tier
			default:
				f.Keys[k] = v.Value
			}
		})
	}
	if costs != nil {
		f.Costs = map[string]int64{}
		eachPair(costs, 0, func(k string, v *yaml.Node) {
			var n int64
			if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
				f.Costs[k] = 0 // left empty: zero, as yaml.v3 reads it
			} else if scalarFits(v, reflect.TypeOf(n)) && v.Decode(&n) == nil {
				f.Costs[k] = n
			}
		})
	}
	return err
}

// eachPair calls fn for every key of mapping n, aliases resolved and merge
// keys (<<) expanded, explicit keys after merged ones (so they win).
func eachPair(n *yaml.Node, depth int, fn func(key string, val *yaml.Node)) {
	for n.Kind == yaml.AliasNode && n.Alias != nil && depth < 16 {
		n, depth = n.Alias, depth+1
	}
	if n.Kind != yaml.MappingNode || depth >= 16 {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			if v := n.Content[i+1]; v.Kind == yaml.SequenceNode {
				for _, m := range v.Content {
					eachPair(m, depth+1, fn)
				}
			} else {
				eachPair(v, depth+1, fn)
			}
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
			continue
		}
		for hops := 0; v.Kind == yaml.AliasNode && v.Alias != nil && hops < 16; hops++ {
			v = v.Alias
		}
		fn(k.Value, v)
	}
}

// scalarFits refuses what yaml.v3 would convert silently: a fraction
// into a whole number (2.5 → 2) or a quoted number into a number.
func scalarFits(n *yaml.Node, t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return n.ShortTag() == "!!int"
	case reflect.Float64, reflect.Float32:
		return n.ShortTag() == "!!int" || n.ShortTag() == "!!float"
	}
	return true
}

// mapping walks the pairs of a mapping node: each key once (seen holds the
// keys already defined, with their lines), merge keys (<<) expanded.
func (v *validator) mapping(n *yaml.Node, path string, seen map[string]int, each func(key, val *yaml.Node, p string), merge func(*yaml.Node)) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.Kind == yaml.ScalarNode && key.ShortTag() == "!!merge" {
			if val.Kind == yaml.SequenceNode {
				for _, m := range val.Content {
					merge(m)
				}
			} else {
				merge(val)
			}
			continue
		}
		if key.Kind != yaml.ScalarNode {
			v.failAt(path, key.Line, "a key must be a plain string, got %s", describeNode(key))
			continue
		}
		p := join(path, key.Value)
		if first, dup := seen[key.Value]; dup {
			v.failAt(p, key.Line, "is defined twice (first at line %d)", first)
			continue
		}
		seen[key.Value] = key.Line
		v.lines[p] = key.Line
		each(key, val, p)
	}
}

// fieldsOf maps the yaml names of struct t's fields to their types.
func fieldsOf(t reflect.Type) (map[string]reflect.Type, string) {
	fields := make(map[string]reflect.Type, t.NumField())
	names := make([]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = f.Type
		names = append(names, name)
	}
	return fields, strings.Join(names, ", ")
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "a whole number"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		return strconv.Quote(truncate(n.Value, 40))
	}
	return "nothing"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (v *validator) compile(f File) *Policy {
	p := &Policy{file: f, tiers: make(map[string]tierLimit, len(f.Tiers))}
	if f.Version != 1 {
		v.fail("version", "must be 1, got %d", f.Version)
	}
	if len(f.Tiers) == 0 {
		v.fail("tiers", "at least one tier is required")
	}
	for name, t := range f.Tiers {
		path := "tiers." + name
		if strings.TrimSpace(name) == "" {
			v.fail(path, "a tier needs a name")
		}
		lim := limits.Limit{Burst: t.Burst, SoftLimitPercent: t.SoftLimitPercent, Concurrency: t.Concurrency}
		v.concurrency(path+".concurrency", t.Concurrency)
		if concurrencyOnly(t) {
			if t.Quota != nil {
				v.fail(path+".quota", "a quota is counted on a rate's bucket: give the tier a rate and burst too, or drop the quota")
			}
		} else {
			lim.Rate = v.rate(path, t.Rate, t.Period)
			v.burst(path+".burst", t.Burst)
		}
		v.soft(path+".soft_limit_percent", t.SoftLimitPercent)
		v.unit(path+".unit", t.Unit)
		if t.Quota != nil {
			lim.QuotaLimit, lim.QuotaPeriod = v.quota(path+".quota", t.Quota)
			lim.QuotaID = "tier:" + name
			lim.QuotaDenyUnknown = t.Quota.UnknownWhileDegraded == "deny"
		}
		lim.Store = t.Store
		v.regionScope(path+".scope", t.Scope)
		p.tiers[name] = tierLimit{name: name, limit: lim, global: t.Scope == ScopeGlobal}
	}
	if f.DefaultTier == "" {
		v.fail("default_tier", "is required")
	} else if _, ok := f.Tiers[f.DefaultTier]; !ok {
		v.fail("default_tier", "names tier %q, which is not defined", f.DefaultTier)
	}
	for key, tier := range f.Keys {
		if _, ok := f.Tiers[tier]; !ok {
			v.fail("keys."+key, "names tier %q, which is not defined", tier)
		}
	}
	for key, st := range f.KeyStores {
		v.storeName("keys."+key+".store", st)
	}
	for name, t := range f.Tiers {
		if t.Store != "" {
			v.storeName("tiers."+name+".store", t.Store)
		}
	}
	for scope, cost := range f.Costs {
		if cost < 0 || cost > limits.MaxCost {
			v.fail("costs."+scope, "must be between 0 and %d, got %d", limits.MaxCost, cost)
		}
	}
	if c := f.GlobalCeiling; c != nil {
		rate := v.rate("global_ceiling", c.Rate, c.Period)
		v.burst("global_ceiling.burst", c.Burst)
		p.ceiling = &limits.Limit{Rate: rate, Burst: c.Burst}
	}
	names := map[string]int{}
	for i, r := range f.Rules {
		path := fmt.Sprintf("rules[%d]", i)
		if r.Name == "" {
			v.fail(path+".name", "is required")
		} else if j, dup := names[r.Name]; dup {
			v.fail(path+".name", "%q is already the name of rules[%d]", r.Name, j)
		} else {
			names[r.Name] = i
		}
		if r.Key != "" && r.KeyPrefix != "" {
			v.fail(path, "key and key_prefix cannot both be set")
		}
		if r.Tier != "" {
			if _, ok := f.Tiers[r.Tier]; !ok {
				v.fail(path+".tier", "names tier %q, which is not defined", r.Tier)
			}
		}
		if r.Rate != nil {
			v.rate(path, *r.Rate, r.Period)
		} else if r.Period != "" {
			v.fail(path+".period", "is set without rate")
		}
		if r.Burst != nil {
			v.burst(path+".burst", *r.Burst)
		}
		if r.SoftLimitPercent != nil {
			v.soft(path+".soft_limit_percent", *r.SoftLimitPercent)
		}
		v.unit(path+".unit", r.Unit)
		if r.Quota != nil {
			v.quota(path+".quota", r.Quota)
		}
		v.regionScope(path+".region_scope", r.RegionScope)
		if r.Concurrency != nil && *r.Concurrency != 0 {
			v.concurrency(path+".concurrency", *r.Concurrency)
		}
		if r.Split < 0 || r.Split > 1024 {
			v.fail(path+".split", "must be between 0 and 1024, got %d", r.Split)
		}
		if r.Shadow {
			p.hasShadow = true
			if r.DryRun {
				v.fail(path+".shadow", "a shadow rule is never enforced, so dry_run means nothing on it: use one or the other")
			}
		}
		p.rules = append(p.rules, compiledRule{Rule: r, index: i, scopeGlob: strings.Contains(r.Scope, "*")})
	}
	p.domains = v.domains(f)
	p.priorities = v.priorities(f.Priorities)
	v.globalClasses(f, p)
	if len(v.errs) == 0 {
		v.refillTimes(p)
	}
	return p
}

// refillTimes refuses a limit, as it would resolve (rule over tier, capped
// by the ceiling), whose empty bucket takes more than maxRefill to refill.
func (v *validator) refillTimes(p *Policy) {
	check := func(path string, rate float64, burst int64) {
		switch {
		case rate == 0 && burst == 0:
			return // concurrency alone: no bucket
		case rate == 0 || burst == 0:
			v.fail(path, "rate and burst go together: the tier it applies to has concurrency alone, so give both")
			return
		}
		if c := p.ceiling; c != nil {
			rate, burst = min(rate, c.Rate), min(burst, c.Burst)
		}
		if secs := float64(burst) / rate; secs > maxRefill {
			v.fail(path, "burst %d at %.3g tokens/s takes %.3g years to refill; at most 10 are allowed", burst, rate, secs/(365*24*3600))
		}
	}
	tierNames := make([]string, 0, len(p.tiers))
	for name := range p.tiers {
		tierNames = append(tierNames, name)
	}
	sort.Strings(tierNames)
	for _, name := range tierNames {
		check("tiers."+name, p.tiers[name].limit.Rate, p.tiers[name].limit.Burst)
	}
	for i, r := range p.rules {
		if r.Rate == nil && r.Burst == nil && r.Quota == nil {
			continue
		}
		for _, name := range tierNames {
			if r.Tier != "" && r.Tier != name {
				continue
			}
			lim := p.tiers[name].limit
			if r.Rate != nil {
				lim.Rate = *r.Rate / periodSeconds[r.Period]
			}
			if r.Burst != nil {
				lim.Burst = *r.Burst
			}
			before := len(v.errs)
			if r.Quota != nil && lim.Rate == 0 && lim.Burst == 0 {
				v.fail(fmt.Sprintf("rules[%d].quota", i), "a quota is counted on a rate's bucket, and tier %q has concurrency alone: give the rule a rate and burst too", name)
			}
			check(fmt.Sprintf("rules[%d]", i), lim.Rate, lim.Burst)
			if len(v.errs) > before {
				break // once per rule
			}
		}
	}
}

func (v *validator) rate(path string, rate float64, period string) float64 {
	secs, ok := periodSeconds[period]
	if !ok {
		v.fail(path+".period", "must be second, minute, hour or day, got %q", period)
		secs = 1
	}
	if !(rate > 0) || math.IsInf(rate, 0) {
		v.fail(path+".rate", "must be > 0, got %v", rate)
		return 1
	}
	return rate / secs
}

func (v *validator) burst(path string, burst int64) {
	if burst < 1 || burst > 1<<50 {
		v.fail(path, "must be between 1 and 2^50, got %d", burst)
	}
}

// unit checks a cost unit's name: empty, or 1 to 32 lower-case letters,
// digits and '_' (it is shown as it is, after a number).
func (v *validator) unit(path, u string) {
	if u == "" {
		return
	}
	ok := len(u) <= 32
	for _, c := range u {
		ok = ok && (c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_')
	}
	if !ok {
		v.fail(path, "must be 1 to 32 lower-case letters, digits or '_', got %q", u)
	}
}

func (v *validator) soft(path string, pct float64) {
	if !(pct >= 0 && pct <= 100) { // NaN fails too
		v.fail(path, "must be between 0 and 100, got %v", pct)
	}
}

func (v *validator) quota(path string, q *Quota) (int64, limits.Period) {
	period, ok := quotaPeriods[q.Period]
	if !ok {
		v.fail(path+".period", "must be hour, day or month, got %q", q.Period)
	}
	if q.Limit < 1 || q.Limit > 1<<50 {
		v.fail(path+".limit", "must be between 1 and 2^50, got %d", q.Limit)
	}
	switch q.UnknownWhileDegraded {
	case "", "share", "deny":
	default:
		v.fail(path+".unknown_while_degraded", "must be share or deny, got %q", q.UnknownWhileDegraded)
	}
	return q.Limit, period
}

// globalClasses refuses a limit of scope global under a class below share
// 1: a global limit is spent from each region's pool of the global
// bucket, refilled by leases from the home, where no class floor is kept
// (docs/concurrency.md, "Priority classes on a rate").
func (v *validator) globalClasses(f File, p *Policy) {
	if !p.Sheds() {
		return
	}
	const why = "a global limit cannot keep a priority class's floor (its regions spend from pools): use scope regional, or give every class share 1"
	names := make([]string, 0, len(f.Tiers))
	for name, t := range f.Tiers {
		if t.Scope == ScopeGlobal {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		v.fail("tiers."+name+".scope", why)
	}
	for i, r := range f.Rules {
		if r.RegionScope == ScopeGlobal {
			v.fail(fmt.Sprintf("rules[%d].region_scope", i), why)
		}
	}
}

// regionScope checks a tier's scope or a rule's region_scope.
func (v *validator) regionScope(path, scope string) {
	if scope != "" && scope != ScopeGlobal && scope != ScopeRegional {
		v.fail(path, "must be global or regional, got %q", truncate(scope, 40))
	}
}

// storeName checks the name of a store: what REDIS_STORES may name (letters,
// digits, '_' and '-'), and not "default", the name of REDIS_ADDRS's.
func (v *validator) storeName(path, name string) {
	if !limits.ValidStoreName(name) {
		v.fail(path, "%q is not a store name (letters, digits, '_' and '-'; not \"default\")", truncate(name, 40))
	}
}

// concurrencyOnly reports whether tier t bounds requests in flight and
// nothing else: a concurrency and no rate, burst or period.
func concurrencyOnly(t Tier) bool {
	return t.Concurrency > 0 && t.Rate == 0 && t.Burst == 0 && t.Period == ""
}

func (v *validator) concurrency(path string, n int64) {
	if n < 0 || n > limits.MaxConcurrency {
		v.fail(path, "must be between 1 and %d requests in flight (0 or absent: no limit), got %d", limits.MaxConcurrency, n)
	}
}
