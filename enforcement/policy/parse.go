package policy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ratewarden/ratewarden/enforcement"
)

// MaxFileSize bounds a policy file; a larger one is refused.
const MaxFileSize = 4 << 20

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

// Parse validates a policy file. Every problem is reported at once, each
// with the field's path and line, e.g. `tiers.pro.burst (line 7): must be > 0`.
func Parse(b []byte) (*Policy, error) {
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("policy file is %d bytes, more than %d", len(b), MaxFileSize)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("policy is not valid YAML: %w", err)
	}
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("policy does not match the schema: %w", err)
	}
	lines := map[string]int{}
	indexLines(&root, "", lines)
	v := validator{lines: lines}
	p := v.compile(f)
	if err := errors.Join(v.errs...); err != nil {
		return nil, err
	}
	p.hash = hashOf(b)
	return p, nil
}

// indexLines records the line of every mapping key and sequence item by its
// dotted path (rules[2].burst), so that validation errors can point at it.
func indexLines(n *yaml.Node, path string, lines map[string]int) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			indexLines(c, path, lines)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			lines[p] = k.Line
			indexLines(n.Content[i+1], p, lines)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			lines[p] = c.Line
			indexLines(c, p, lines)
		}
	}
}

type validator struct {
	lines map[string]int
	errs  []error
}

func (v *validator) fail(path, format string, args ...any) {
	where := path
	for p := path; p != ""; p = parent(p) {
		if line, ok := v.lines[p]; ok {
			where = fmt.Sprintf("%s (line %d)", path, line)
			break
		}
	}
	if where == "" {
		where = "policy"
	}
	v.errs = append(v.errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
}

func parent(p string) string {
	if i := strings.LastIndexAny(p, ".["); i >= 0 {
		return p[:i]
	}
	return ""
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
		lim := enforcement.Limit{Burst: t.Burst, SoftLimitPercent: t.SoftLimitPercent}
		lim.Rate = v.rate(path, t.Rate, t.Period)
		v.burst(path+".burst", t.Burst)
		v.soft(path+".soft_limit_percent", t.SoftLimitPercent)
		if t.Quota != nil {
			lim.QuotaLimit, lim.QuotaPeriod = v.quota(path+".quota", t.Quota)
			lim.QuotaID = "tier:" + name
		}
		p.tiers[name] = tierLimit{name: name, limit: lim}
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
	for scope, cost := range f.Costs {
		if cost < 0 || cost > 1_000_000_000 {
			v.fail("costs."+scope, "must be between 0 and 1000000000, got %d", cost)
		}
	}
	if c := f.GlobalCeiling; c != nil {
		rate := v.rate("global_ceiling", c.Rate, c.Period)
		v.burst("global_ceiling.burst", c.Burst)
		p.ceiling = &enforcement.Limit{Rate: rate, Burst: c.Burst}
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
		if r.Quota != nil {
			v.quota(path+".quota", r.Quota)
		}
		if r.Split < 0 || r.Split > 1024 {
			v.fail(path+".split", "must be between 0 and 1024, got %d", r.Split)
		}
		p.rules = append(p.rules, compiledRule{Rule: r, index: i, scopeGlob: strings.Contains(r.Scope, "*")})
	}
	return p
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

func (v *validator) soft(path string, pct float64) {
	if pct < 0 || pct > 100 {
		v.fail(path, "must be between 0 and 100, got %v", pct)
	}
}

func (v *validator) quota(path string, q *Quota) (int64, enforcement.Period) {
	period, ok := quotaPeriods[q.Period]
	if !ok {
		v.fail(path+".period", "must be hour, day or month, got %q", q.Period)
	}
	if q.Limit < 1 {
		v.fail(path+".limit", "must be ≥ 1, got %d", q.Limit)
	}
	return q.Limit, period
}
