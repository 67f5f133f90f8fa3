// Package enforcement is the rate limiter's domain: limits, token buckets, the
// in-process local tier, the two-tier decision and its failure policy.
//
// A decision runs in three steps (see Limiter.Check):
//
//  1. the local tier, an in-process token bucket per (key, scope) sized loosely
//     from the resolved limit, rejects floods with no network work at all;
//  2. the shared authority (one atomic script in Redis, or the in-process
//     MemoryAuthority in single-node mode) decides exactly;
//  3. when the authority cannot be asked, a tightened local bucket decides
//     (source "degraded"): protection degrades from exact to approximate and
//     never vanishes.
//
// The package uses the standard library only; Redis, HTTP, metrics and policy
// files live in subpackages that depend on it, never the other way round.
package enforcement

import (
	"errors"
	"strings"
	"time"
)

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
}

// capacity is the largest cost a request can ever be allowed: the burst, or
// one sub-bucket's when the key is split.
func (l Limit) capacity() int64 {
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
}

// Request asks whether a key may spend Cost tokens in Scope.
type Request struct {
	Key   string
	Scope string
	Tier  string // optional; empty = the policy's key-to-tier map, else the default tier
	Cost  int64  // tokens to spend; meaningful only when HasCost
	// HasCost distinguishes "cost 0" from "no cost given" (the scope's cost).
	HasCost bool
}

// Keys of traffic with no identity. The seed's check that forwarded headers
// are trusted correctly watches the rejection ratio of exactly these.
const (
	// AddressKeyPrefix starts the key of traffic limited by client address.
	AddressKeyPrefix = "ip:"
	// AnonymousKey is the key of traffic with neither identity nor address.
	AnonymousKey = "anonymous"
)

// IsAnonymous reports whether key is anonymous traffic: keyed by client
// address, or by nothing at all.
func IsAnonymous(key string) bool {
	return key == AnonymousKey || strings.HasPrefix(key, AddressKeyPrefix)
}

// Source says which tier made a decision.
type Source uint8

// Decision sources, as reported in the "source" field.
const (
	SourceLocal    Source = iota + 1 // decided in process with no network work (the local tier, or leased tokens)
	SourceShared                     // the shared authority decided
	SourceDegraded                   // the authority could not be asked; the tightened local limit decided
)

// String returns the contract's spelling of s.
func (s Source) String() string {
	switch s {
	case SourceLocal:
		return "local"
	case SourceShared:
		return "shared"
	case SourceDegraded:
		return "degraded"
	}
	return "unknown"
}

// Decision is the answer to a Request. A rejection is a Decision with
// Allowed false, never an error.
type Decision struct {
	Allowed    bool
	WouldAllow bool // what enforcement decided; differs from Allowed only in dry run
	DryRun     bool
	Warning    bool          // consumption is at or above the soft limit
	Remaining  int64         // whole tokens left after this decision
	Limit      int64         // the bucket's capacity
	ResetAt    time.Time     // when the bucket will be full again
	RetryAfter time.Duration // 0 when allowed; else exact time until Cost tokens are there (ms precision, rounded up)
	Source     Source
	Policy     string
	Tier       string
	Cost       int64 // the cost that was charged for (after defaults)
}

// Errors a caller branches on.
var (
	// ErrCostExceedsLimit: the cost is larger than the bucket's capacity, so
	// the request could never be allowed.
	ErrCostExceedsLimit = errors.New("cost exceeds the bucket's capacity")
	// ErrInvalidRequest: the request is malformed (empty key or scope, negative cost).
	ErrInvalidRequest = errors.New("invalid request")
)
