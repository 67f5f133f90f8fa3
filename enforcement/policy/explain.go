package policy

import (
	"fmt"
	"strings"
)

// Explain describes, for an operator, how (key, scope, tier) resolves: the
// tier and why, every matching rule, the winner and why, and the resulting
// rate, burst, cost, quota, soft limit and dry run.
func Explain(p *Policy, key, scope, tier string) string {
	var b strings.Builder
	f := p.File()
	why := "given with the request"
	if tier == "" {
		if t, ok := f.Keys[key]; ok {
			tier, why = t, "from the keys map"
		} else {
			tier, why = f.DefaultTier, "default_tier"
		}
	}
	fmt.Fprintf(&b, "key %q, scope %q\ntier: %s (%s)\n", key, scope, tier, why)
	res, err := p.Resolve(key, scope, tier)
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
		return b.String()
	}
	winner, matched := p.Matches(key, scope, tier)
	if len(matched) == 0 {
		b.WriteString("rules matched: none; the tier's own limit applies\n")
	} else {
		b.WriteString("rules matched (file order):\n")
		for _, r := range matched {
			mark := " "
			if winner != nil && r.Name == winner.Name {
				mark = "*"
			}
			fmt.Fprintf(&b, "  %s %-20s %s\n", mark, r.Name, describe(r))
		}
		fmt.Fprintf(&b, "winner: %s (most specific: exact key > key_prefix > tier, then exact scope > glob > none; ties to the first listed)\n", winner.Name)
	}
	fmt.Fprintf(&b, "result: policy=%s rate=%g/s burst=%d cost=%d", res.Policy, res.Rate, res.Burst, res.Cost)
	if res.HasQuota() {
		fmt.Fprintf(&b, " quota=%d/%s", res.QuotaLimit, res.QuotaPeriod)
	}
	if res.SoftLimitPercent > 0 {
		fmt.Fprintf(&b, " soft_limit=%g%%", res.SoftLimitPercent)
	}
	if res.DryRun {
		b.WriteString(" dry_run=true")
	}
	b.WriteString("\n")
	if c := f.GlobalCeiling; c != nil {
		fmt.Fprintf(&b, "global_ceiling: rate=%g per %s burst=%d (applied)\n", c.Rate, orSecond(c.Period), c.Burst)
	}
	return b.String()
}

func describe(r Rule) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("key", r.Key)
	add("key_prefix", r.KeyPrefix)
	add("tier", r.Tier)
	add("scope", r.Scope)
	return strings.Join(parts, " ")
}

func orSecond(p string) string {
	if p == "" {
		return "second"
	}
	return p
}
