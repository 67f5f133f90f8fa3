package policy

import (
	"fmt"
	"strings"
)

// Explain describes, for an operator, how (key, scope, tier) resolves: the
// tier and why, every matching rule in file order, the winner and why, and
// the resulting rate, burst, cost, quota, soft limit and dry run, each with
// where it came from.
func Explain(p *Policy, key, scope, tier string) string {
	var b strings.Builder
	f := p.File()
	why := "given with the request"
	if tier == "" {
		if t, ok := f.Keys[key]; ok {
			tier, why = t, "from the keys map"
		} else {
			tier, why = f.DefaultTier, "default_tier; the key is not in the keys map"
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
		b.WriteString("rules matched (file order, * = winner, s = shadow: reported, never enforced):\n")
		for _, r := range matched {
			mark := " "
			switch {
			case r.Shadow:
				mark = "s"
			case winner != nil && r.Name == winner.Name:
				mark = "*"
			}
			fmt.Fprintf(&b, "  %s %-24s %-40s specificity: %s\n", mark, r.Name, describe(r), rankWords(r))
		}
		if winner != nil {
			fmt.Fprintf(&b, "winner: %s (exact key > key_prefix > tier > none, then exact scope > glob > none; ties go to the rule listed first)\n", winner.Name)
		} else {
			b.WriteString("winner: none enforced (only shadow rules match); the tier's own limit applies\n")
		}
	}

	from := func(set bool) string {
		if set {
			return "rule " + winner.Name
		}
		return "tier " + tier
	}
	var rateSet, burstSet, softSet, quotaSet bool
	if winner != nil {
		rateSet, burstSet = winner.Rate != nil, winner.Burst != nil
		softSet, quotaSet = winner.SoftLimitPercent != nil, winner.Quota != nil
	}
	t := f.Tiers[tier]
	rateFrom, burstFrom := from(rateSet), from(burstSet)
	if c := f.GlobalCeiling; c != nil {
		ruleRate, ruleBurst := t.Rate/periodSeconds[t.Period], t.Burst
		if rateSet {
			ruleRate = *winner.Rate / periodSeconds[winner.Period]
		}
		if burstSet {
			ruleBurst = *winner.Burst
		}
		if res.Rate < ruleRate {
			rateFrom = fmt.Sprintf("global_ceiling; %s said %g/s", rateFrom, ruleRate)
		}
		if res.Burst < ruleBurst {
			burstFrom = fmt.Sprintf("global_ceiling; %s said %d", burstFrom, ruleBurst)
		}
	}
	costFrom := "default: the scope is not in costs"
	if _, ok := f.Costs[scope]; ok {
		costFrom = fmt.Sprintf("costs[%q]", scope)
	}
	fmt.Fprintf(&b, "result: policy=%s rate=%g/s burst=%d cost=%d", res.Policy, res.Rate, res.Burst, res.Cost)
	quota := "none"
	if res.HasQuota() {
		quota = fmt.Sprintf("%d/%s", res.QuotaLimit, res.QuotaPeriod)
		fmt.Fprintf(&b, " quota=%s", quota)
	}
	if res.SoftLimitPercent > 0 {
		fmt.Fprintf(&b, " soft_limit=%g%%", res.SoftLimitPercent)
	}
	if res.DryRun {
		b.WriteString(" dry_run=true")
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  rate        %g tokens/s (%s)\n", res.Rate, rateFrom)
	fmt.Fprintf(&b, "  burst       %d (%s)\n", res.Burst, burstFrom)
	fmt.Fprintf(&b, "  cost        %d per request without an explicit cost (%s)\n", res.Cost, costFrom)
	if res.HasQuota() {
		fmt.Fprintf(&b, "  quota       %s, UTC calendar window, counter %q (%s)\n", quota, res.QuotaID, from(quotaSet))
	} else {
		b.WriteString("  quota       none\n")
	}
	if res.SoftLimitPercent > 0 {
		fmt.Fprintf(&b, "  soft limit  warning at %g%% of the bucket or quota used (%s)\n", res.SoftLimitPercent, from(softSet))
	}
	switch {
	case f.DryRun:
		b.WriteString("  dry run     yes: the whole file is in dry run; nothing is rejected\n")
	case res.DryRun:
		fmt.Fprintf(&b, "  dry run     yes: rule %s is in dry run; nothing is rejected, would-be rejections are counted\n", winner.Name)
	}
	if res.Cost > res.Burst {
		fmt.Fprintf(&b, "  warning     cost %d exceeds burst %d: every such request is refused with cost_exceeds_limit\n", res.Cost, res.Burst)
	}
	if res.Split > 1 {
		fmt.Fprintf(&b, "  split       %d sub-buckets of rate %g/s, burst %d each\n", res.Split, res.Rate/float64(res.Split), max(1, res.Burst/int64(res.Split)))
	}
	if sres, ok, _ := p.ResolveShadow(key, scope, tier); ok {
		fmt.Fprintf(&b, "shadow: %s rate=%g/s burst=%d cost=%d", sres.Policy, sres.Rate, sres.Burst, sres.Cost)
		if sres.HasQuota() {
			fmt.Fprintf(&b, " quota=%d/%s", sres.QuotaLimit, sres.QuotaPeriod)
		}
		b.WriteString(" (decided beside the result in its own bucket, reported, never enforced)\n")
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
	if len(parts) == 0 {
		return "(matches everything)"
	}
	return strings.Join(parts, " ")
}

func rankWords(r Rule) string {
	k := "no key matcher"
	switch {
	case r.Key != "":
		k = "exact key"
	case r.KeyPrefix != "":
		k = "key_prefix"
	case r.Tier != "":
		k = "tier"
	}
	s := "no scope"
	switch {
	case r.Scope != "" && strings.Contains(r.Scope, "*"):
		s = "glob scope"
	case r.Scope != "":
		s = "exact scope"
	}
	return k + ", " + s
}
