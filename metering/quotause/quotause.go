// Package quotause says how much of each enforced calendar quota the usage
// record (the ClickHouse rollups) has a key spending in the current window.
//
// The rollups record allowed cost per (key, scope, tier, bucket); the limiter
// counts a quota per (key, QuotaID), where the QuotaID is what the policy
// resolves (key, scope, tier) to. Attribute replays that resolution with the
// limiter's own code (package policy) on every recorded (key, scope, tier):
// the tier is the one the decision was made under (the event's resolved
// tier), so a key whose tier changed mid-period has its earlier spend
// attributed to the earlier tier's quota and its later spend to the new
// one — exactly the counters the limiter incremented. The reconciler
// (metering/reconcile) and the usage API (metering/usage) both attribute
// through this package, so the number the reconciler restores and the number
// a customer is shown are one number.
//
// Across regions, a limit with scope global is one limit shared by every
// region: its quota counts every region's usage (Rows, summed over regions).
// A regional limit is enforced by each region on its own: its quota counter
// in a region's store counts that region's usage only (Reader.RegionRows).
// InRegion picks, for one region, the rows each counter must count.
package quotause

import (
	"sort"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// Row is the allowed cost one (key, scope, tier) has recorded in the UTC
// hour, day and month that contain the time the rows were read for.
type Row struct {
	Key, Scope, Tier string
	Hour, Day, Month uint64
}

// Spent is the row's allowed cost in the current window of period p.
func (r Row) Spent(p limits.Period) uint64 {
	switch p {
	case limits.PeriodHour:
		return r.Hour
	case limits.PeriodDay:
		return r.Day
	case limits.PeriodMonth:
		return r.Month
	}
	return 0
}

// Resolver is the policy's resolution (*policy.Policy).
type Resolver interface {
	Resolve(key, scope, tier string) (limits.Resolved, error)
}

// Quota is one enforced quota counter of one key in the current window and
// what the record says was spent against it.
type Quota struct {
	Key     string
	QuotaID string // "tier:<name>" or "rule:<name>": the counter's name
	Limit   int64  // allowance per window
	Period  limits.Period
	Start   time.Time // the window, [Start, End), UTC
	End     time.Time
	// Used is the allowed cost recorded in the window by decisions whose
	// limit was enforced. Decisions under a dry-run limit are left out:
	// dry run allows every request whether or not the quota had room, so
	// the record cannot tell which of them the counter counted, and the
	// reconciler must never raise a counter past what enforcement spent.
	Used uint64
	// DryRunUsed is the allowed cost recorded under dry-run limits.
	DryRunUsed uint64
	// Scopes are the recorded scopes attributed to this counter, sorted.
	Scopes []string
	// Global: the limit is one for every region (scope global); across
	// regions its counter is kept at the home (enforcement/global).
	Global bool
}

// RedisKey is the counter's Redis key under prefix (limits.QuotaKey).
func (q Quota) RedisKey(prefix string) string {
	return limits.QuotaKey(prefix, q.Key, q.QuotaID, q.Start)
}

// Skipped counts recorded rows that no enforced quota counts.
type Skipped struct {
	NoQuota     int // the (key, scope, tier) resolves to a limit without a quota
	UnknownTier int // the recorded tier is no longer in the policy
}

type counterID struct{ key, quotaID string }

// Attribute groups rows by the quota counter the policy resolves them to,
// for the windows that contain now. The result is sorted by key, then
// QuotaID. Rows that resolve to no quota are counted in Skipped and appear
// nowhere else.
func Attribute(pol Resolver, rows []Row, now time.Time) ([]Quota, Skipped) {
	var skipped Skipped
	byID := map[counterID]*Quota{}
	scopes := map[counterID]map[string]bool{}
	for _, r := range rows {
		res, err := pol.Resolve(r.Key, r.Scope, r.Tier)
		if err != nil {
			skipped.UnknownTier++
			continue
		}
		if !res.HasQuota() {
			skipped.NoQuota++
			continue
		}
		id := counterID{r.Key, res.QuotaID}
		q := byID[id]
		if q == nil {
			q = newQuota(r.Key, res, now)
			byID[id] = q
			scopes[id] = map[string]bool{}
		}
		if res.DryRun {
			q.DryRunUsed += r.Spent(res.QuotaPeriod)
		} else {
			q.Used += r.Spent(res.QuotaPeriod)
		}
		scopes[id][r.Scope] = true
	}
	out := make([]Quota, 0, len(byID))
	for id, q := range byID {
		for s := range scopes[id] {
			q.Scopes = append(q.Scopes, s)
		}
		sort.Strings(q.Scopes)
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].QuotaID < out[j].QuotaID
	})
	return out, skipped
}

func newQuota(key string, res limits.Resolved, now time.Time) *Quota {
	start, end := res.QuotaPeriod.Window(now)
	return &Quota{Key: key, QuotaID: res.QuotaID, Limit: res.QuotaLimit, Period: res.QuotaPeriod, Start: start, End: end, Global: res.Global}
}

// For returns the counter that res (a resolution of key with a quota)
// spends, from quotas (Attribute's result for key's rows), or the same
// counter with nothing recorded yet.
func For(key string, res limits.Resolved, quotas []Quota, now time.Time) Quota {
	for _, q := range quotas {
		if q.Key == key && q.QuotaID == res.QuotaID {
			return q
		}
	}
	return *newQuota(key, res, now)
}

// InRegion is the usage the quota counters of one region's store count,
// for Attribute: the rows of all (every region's usage, Reader.Rows) whose
// limit is global, and the rows of inRegion (that region's own usage,
// Reader.RegionRows) whose limit is regional. Rows that resolve to no limit
// are kept from all, for Attribute to count as skipped.
func InRegion(pol Resolver, all, inRegion []Row) []Row {
	out := make([]Row, 0, len(all))
	for _, r := range all {
		if res, err := pol.Resolve(r.Key, r.Scope, r.Tier); err != nil || res.Global {
			out = append(out, r)
		}
	}
	for _, r := range inRegion {
		if res, err := pol.Resolve(r.Key, r.Scope, r.Tier); err == nil && !res.Global {
			out = append(out, r)
		}
	}
	return out
}
