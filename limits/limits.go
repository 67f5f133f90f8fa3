// Package limits is what a limit is — a token bucket's rate and burst, a
// calendar quota, the rule that set them — with no behaviour attached. The
// policy file resolves to these values (package policy), the limiter
// enforces them (package enforcement), and the accounting side reports
// against them (package metering/usage): each of those imports this leaf
// package, none imports another for it.
package limits

import (
	"errors"
	"time"
)

// ErrUnknownTier is returned by a policy for a tier it does not define.
var ErrUnknownTier = errors.New("unknown tier")

// Period is the calendar window of a quota, in UTC.
type Period uint8

// Quota periods. PeriodNone means the limit has no quota.
const (
	PeriodNone Period = iota
	PeriodHour
	PeriodDay
	PeriodMonth
)

// String returns the policy-file spelling of p.
func (p Period) String() string {
	switch p {
	case PeriodHour:
		return "hour"
	case PeriodDay:
		return "day"
	case PeriodMonth:
		return "month"
	}
	return "none"
}

// Window returns the UTC calendar window of period p that contains t.
// For PeriodNone it returns the zero times.
func (p Period) Window(t time.Time) (start, end time.Time) {
	t = t.UTC()
	switch p {
	case PeriodHour:
		start = t.Truncate(time.Hour)
		return start, start.Add(time.Hour)
	case PeriodDay:
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	case PeriodMonth:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
	return time.Time{}, time.Time{}
}

// Limit is what one bucket enforces. The zero value is not a valid limit:
// Rate and Burst must be positive.
type Limit struct {
	Rate  float64 // sustained refill, tokens per second
	Burst int64   // capacity: the largest burst, and the largest cost ever allowed

	QuotaLimit  int64  // tokens allowed per QuotaPeriod window; 0 = no quota
	QuotaPeriod Period // PeriodNone = no quota
	// QuotaID names the allowance: limits of one key that share a QuotaID
	// (the tier or rule that set the quota) spend one counter across scopes.
	QuotaID string
	// QuotaDenyUnknown: while the shared store cannot be asked, a key whose
	// quota use in the current window was never reported to this instance
	// gets nothing of the quota (rather than its share of the whole quota).
	QuotaDenyUnknown bool

	// SoftLimitPercent sets Decision.Warning when consumption (of the bucket,
	// or of the quota) reaches this percentage; 0 = no soft limit.
	SoftLimitPercent float64

	// Split spreads a hot key's bucket over Split sub-keys, each holding
	// 1/Split of the rate and burst (key splitting); 0 or 1 = one bucket.
	Split int

	// Store names the shared store that decides the key (dedicated
	// capacity, REDIS_STORES); "" = the default store.
	Store string

	// Concurrency is the most requests of the key (and scope) in flight at
	// once across the fleet (policy `concurrency:`): each holds a slot,
	// under a lease, until it gives it back (docs/concurrency.md); 0 = no
	// concurrency limit.
	Concurrency int64

	// Share is the request's priority class's share of the bucket (policy
	// `priorities`), set per request by the limiter, never by the policy:
	// a request is allowed only if it leaves at least Floor tokens. 0 (or
	// 1) = the whole bucket, as without priorities.
	Share float64
}

// Floor is the tokens a request of the limit's Share must leave in the
// bucket: (1 − Share) × the bucket's capacity (a split key's sub-bucket's
// own, so each sub-bucket keeps the same proportion), 0 for a class of
// the whole bucket. It is the one place the floor is computed; every
// script and copy that spends tokens takes it from here.
func (l Limit) Floor() float64 {
	if l.Share <= 0 || l.Share >= 1 {
		return 0
	}
	return (1 - l.Share) * float64(l.Burst)
}

// HasRate reports whether the limit has a token bucket. A limit of
// concurrency alone (policy `concurrency:` without rate and burst) has
// none: it bounds requests in flight, not requests per second.
func (l Limit) HasRate() bool { return l.Rate > 0 && l.Burst > 0 }

// Capacity is the largest cost a request can ever be allowed: the burst, or
// one sub-bucket's when the key is split.
func (l Limit) Capacity() int64 {
	if l.Split > 1 {
		return max(1, l.Burst/int64(l.Split))
	}
	return l.Burst
}

// HasQuota reports whether the limit carries a calendar quota.
func (l Limit) HasQuota() bool { return l.QuotaLimit > 0 && l.QuotaPeriod != PeriodNone }

// Resolved is a limit together with what the policy said about it.
type Resolved struct {
	Limit
	Policy string // name of the rule (or tier) that set the limit
	Tier   string // the tier the request resolved to
	DryRun bool   // count what would be rejected, reject nothing
	Cost   int64  // the scope's cost when the request names none
	Unit   string // what the cost counts ("tokens"), "" when the policy names nothing
	// Global: one limit shared by every region (policy `scope: global`),
	// enforced from the region's pool of the key's global budget; false =
	// each region enforces the limit on its own (the default, and all a
	// one-region deployment ever does).
	Global bool
}

// DefaultStore is the name of the default store (REDIS_ADDRS) in readiness
// and metrics; Limit.Store leaves it empty.
const DefaultStore = "default"

// ValidStoreName reports whether name may name a store (REDIS_STORES, a
// policy's store:): 1 to 64 letters, digits, '_' and '-', and not
// DefaultStore.
func ValidStoreName(name string) bool {
	if name == "" || len(name) > 64 || name == DefaultStore {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
