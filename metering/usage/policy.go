package usage

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Policy is the part of the limiter's policy file (CONTRACT.md "Policy file")
// that the usage API needs: which tier a key is on, and that tier's quota and
// soft limit. Everything else in the file is ignored. A Policy is immutable
// once loaded and safe for concurrent use.
type Policy struct {
	DefaultTier string                `yaml:"default_tier"`
	Tiers       map[string]policyTier `yaml:"tiers"`
	Keys        map[string]string     `yaml:"keys"`
	Rules       []policyRule          `yaml:"rules"`
}

type policyTier struct {
	SoftLimitPercent float64      `yaml:"soft_limit_percent"`
	Quota            *policyQuota `yaml:"quota"`
}

type policyRule struct {
	Name             string       `yaml:"name"`
	Key              string       `yaml:"key"`
	KeyPrefix        string       `yaml:"key_prefix"`
	Scope            string       `yaml:"scope"`
	Tier             string       `yaml:"tier"`
	SoftLimitPercent float64      `yaml:"soft_limit_percent"`
	Quota            *policyQuota `yaml:"quota"`
}

type policyQuota struct {
	Limit  uint64 `yaml:"limit"`
	Period string `yaml:"period"`
}

// LoadPolicy reads and parses the policy file at path.
func LoadPolicy(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return ParsePolicy(b)
}

// ParsePolicy parses a policy document.
func ParsePolicy(b []byte) (*Policy, error) {
	var p Policy
	if err := yaml.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("parse policy: %w", err)
	}
	var errs []error
	check := func(where string, q *policyQuota) {
		if q == nil {
			return
		}
		if _, err := periodStart(q.Period, time.Now()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	for name, t := range p.Tiers {
		check("tier "+name+" quota", t.Quota)
	}
	for i, r := range p.Rules {
		check(fmt.Sprintf("rule %d (%s) quota", i, r.Name), r.Quota)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("parse policy: %w", err)
	}
	return &p, nil
}

// Quota is the calendar-window allowance that applies to a key, if any.
type Quota struct {
	Tier             string
	Source           string  // "tier" or "rule <name>"
	Limit            uint64  // tokens per period
	Period           string  // hour | day | month (UTC)
	SoftLimitPercent float64 // 0 = no soft limit
}

// QuotaFor returns the quota and soft limit that apply to key, and whether a
// quota applies at all. A rule with quota that names the key exactly, else the
// longest key_prefix, wins over the tier's quota; scope-specific rules are
// not key-wide quotas and are not reported here.
func (p *Policy) QuotaFor(key string) (Quota, bool) {
	tier := p.DefaultTier
	if t, ok := p.Keys[key]; ok {
		tier = t
	}
	t := p.Tiers[tier]
	out := Quota{Tier: tier, Source: "tier", SoftLimitPercent: t.SoftLimitPercent}
	if t.Quota != nil {
		out.Limit, out.Period = t.Quota.Limit, t.Quota.Period
	}
	var best *policyRule
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Quota == nil || r.Scope != "" || (r.Tier != "" && r.Tier != tier) {
			continue
		}
		switch {
		case r.Key != "" && r.Key == key:
			if best == nil || best.Key == "" {
				best = r
			}
		case r.Key == "" && r.KeyPrefix != "" && strings.HasPrefix(key, r.KeyPrefix):
			if best == nil || (best.Key == "" && len(r.KeyPrefix) > len(best.KeyPrefix)) {
				best = r
			}
		}
	}
	if best != nil {
		out.Limit, out.Period, out.Source = best.Quota.Limit, best.Quota.Period, "rule "+best.Name
		if best.SoftLimitPercent > 0 {
			out.SoftLimitPercent = best.SoftLimitPercent
		}
	}
	return out, out.Period != ""
}

// periodStart is the start (UTC) of the calendar period that holds now.
func periodStart(period string, now time.Time) (time.Time, error) {
	now = now.UTC()
	switch period {
	case "hour":
		return now.Truncate(time.Hour), nil
	case "day":
		return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC), nil
	case "month":
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC), nil
	}
	return time.Time{}, fmt.Errorf("quota period must be hour, day or month, got %q", period)
}

// periodEnd is the start of the period after the one that starts at start.
func periodEnd(period string, start time.Time) time.Time {
	switch period {
	case "hour":
		return start.Add(time.Hour)
	case "day":
		return start.AddDate(0, 0, 1)
	default:
		return start.AddDate(0, 1, 0)
	}
}
