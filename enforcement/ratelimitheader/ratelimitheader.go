// Package ratelimitheader writes a decision as HTTP rate-limit header
// fields: the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-11, serialised as RFC 9651
// structured fields, and the values of the legacy RateLimit-Limit,
// RateLimit-Remaining, RateLimit-Reset trio and of Retry-After. It is the
// one place the limiter's three front doors (the Go middleware, POST /check
// and the Envoy rate limit service) take these values from.
//
// How a decision maps onto the draft (docs/ratelimit-headers.md says why):
//
//   - the token bucket is a policy named after the rule, q = burst and
//     w = the whole seconds an empty bucket takes to refill,
//     ceil(burst ÷ rate); its service limit is r = whole tokens left and
//     t = the whole seconds until the bucket is full again, at most w;
//   - a calendar quota is a second policy, named after the rule with
//     QuotaSuffix, q = the quota and w = the current window's length in
//     seconds; r = what is left in the window, t = seconds to its end;
//   - on a rejection, the t of every item whose r cannot cover the cost is
//     the Retry-After, so that Retry-After is never earlier than the end
//     of the effective window that refused (the draft's section 6).
//
// Every function appends to a caller's buffer and allocates nothing.
package ratelimitheader

import (
	"errors"
	"math"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Field names.
const (
	PolicyField    = "RateLimit-Policy"
	RateLimitField = "RateLimit"
	LimitField     = "RateLimit-Limit"
	RemainingField = "RateLimit-Remaining"
	ResetField     = "RateLimit-Reset"
	RetryAfter     = "Retry-After"
)

// QuotaSuffix ends the name of a calendar quota's policy item: the rule
// "pro" advertises its bucket as "pro" and its quota as "pro-quota".
const QuotaSuffix = "-quota"

// Parameter keys (RFC 9651 keys: lowercase, see TestParameterKeys).
const (
	keyQuota     = "q"
	keyWindow    = "w"
	keyRemaining = "r"
	keyReset     = "t"
)

// Mode selects the header fields a front door writes. The zero value is
// Both.
type Mode uint8

// Modes.
const (
	Both   Mode = iota // the legacy trio and the draft's two fields
	Legacy             // RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset only
	Draft              // RateLimit-Policy and RateLimit only
	None               // no rate-limit fields (Retry-After is still sent on a rejection)
)

// ErrMode is returned by ParseMode for an unknown spelling.
var ErrMode = errors.New(`must be "legacy", "draft", "both" or "none"`)

// ParseMode parses a mode's spelling; "" is Both.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "both":
		return Both, nil
	case "legacy":
		return Legacy, nil
	case "draft":
		return Draft, nil
	case "none":
		return None, nil
	}
	return Both, ErrMode
}

// String returns the mode's spelling.
func (m Mode) String() string {
	switch m {
	case Both:
		return "both"
	case Legacy:
		return "legacy"
	case Draft:
		return "draft"
	case None:
		return "none"
	}
	return "unknown"
}

// LegacyFields reports whether m writes the legacy trio.
func (m Mode) LegacyFields() bool { return m == Both || m == Legacy }

// DraftFields reports whether m writes RateLimit-Policy and RateLimit.
func (m Mode) DraftFields() bool { return m == Both || m == Draft }

// CeilSeconds is d in whole seconds, rounded up; 0 for d ≤ 0. Every
// delay-seconds value (t, RateLimit-Reset, Retry-After) is rounded up: a
// client told to wait never comes back early.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ResetSeconds is RateLimit-Reset: whole seconds until d.ResetAt.
func ResetSeconds(d *enforcement.Decision, now time.Time) int64 {
	return CeilSeconds(d.ResetAt.Sub(now))
}

// RetryAfterSeconds is Retry-After for a rejection: whole seconds until
// the cost can pass, rounded up.
func RetryAfterSeconds(d *enforcement.Decision) int64 {
	return CeilSeconds(d.RetryAfter)
}

// bucketWindow is the bucket's w: the whole seconds an empty bucket takes to
// refill, at least 1 (the draft's w is a non-zero integer).
func bucketWindow(b *enforcement.BucketState) int64 {
	if b.Rate <= 0 || math.IsNaN(b.Rate) {
		return maxInteger
	}
	// A relative 1e-12 below the quotient first: a refill time that is a
	// whole number of seconds (burst 3 at 10 a minute) must not round up
	// to the next one for a last-bit error of the division.
	w := math.Ceil(float64(b.Burst) / b.Rate * (1 - 1e-12))
	if w >= maxInteger {
		return maxInteger
	}
	return max(1, int64(w))
}

// quotaWindow is the quota's w: the length of its current calendar window
// (a month window is 28 to 31 days long).
func quotaWindow(q *enforcement.QuotaState, now time.Time) int64 {
	at := now
	if q.Known {
		at = q.ResetAt.Add(-time.Nanosecond) // inside the window the decision saw
	}
	start, end := q.Period.Window(at)
	return max(1, CeilSeconds(end.Sub(start)))
}

// HasPolicy reports whether d has anything to advertise: a decision that
// reached a bucket. An empty RateLimit-Policy or RateLimit field is
// invalid (the draft's lists are non-empty): leave both out when false.
func HasPolicy(d *enforcement.Decision) bool { return d.Bucket.Burst > 0 }

// AppendPolicy appends the RateLimit-Policy field value of d to b: the
// bucket's item and, when the limit has a calendar quota, the quota's. It
// appends nothing when HasPolicy(d) is false.
func AppendPolicy(b []byte, d *enforcement.Decision, now time.Time) []byte {
	if !HasPolicy(d) {
		return b
	}
	b = appendString(b, d.Policy, "")
	b = appendParamInteger(b, keyQuota, d.Bucket.Burst)
	b = appendParamInteger(b, keyWindow, bucketWindow(&d.Bucket))
	if d.Quota.Limit > 0 {
		b = append(b, ", "...)
		b = appendString(b, d.Policy, QuotaSuffix)
		b = appendParamInteger(b, keyQuota, d.Quota.Limit)
		b = appendParamInteger(b, keyWindow, quotaWindow(&d.Quota, now))
	}
	return b
}

// AppendRateLimit appends the RateLimit field value of d to b at now: the
// bucket's service limit and, when this instance knows the quota window's
// spend, the quota's. It appends nothing when HasPolicy(d) is false.
func AppendRateLimit(b []byte, d *enforcement.Decision, now time.Time) []byte {
	if !HasPolicy(d) {
		return b
	}
	retry := int64(-1) // the cap on t of the items that refused; none when allowed
	if !d.Allowed {
		retry = RetryAfterSeconds(d)
	}
	bt := min(CeilSeconds(d.Bucket.ResetAt.Sub(now)), bucketWindow(&d.Bucket))
	if retry >= 0 && d.Bucket.Remaining < d.Cost {
		bt = min(bt, retry)
	}
	b = appendString(b, d.Policy, "")
	b = appendParamInteger(b, keyRemaining, d.Bucket.Remaining)
	b = appendParamInteger(b, keyReset, bt)
	if d.Quota.Limit > 0 && d.Quota.Known {
		qt := CeilSeconds(d.Quota.ResetAt.Sub(now))
		if retry >= 0 && d.Quota.Remaining < d.Cost {
			qt = min(qt, retry)
		}
		b = append(b, ", "...)
		b = appendString(b, d.Policy, QuotaSuffix)
		b = appendParamInteger(b, keyRemaining, d.Quota.Remaining)
		b = appendParamInteger(b, keyReset, qt)
	}
	return b
}

// AppendViolated appends to b, as a JSON array of strings, the names of the
// policy items whose remaining quota could not cover a rejected decision's
// cost: the problem type quota-exceeded's "violated-policies" member. An
// sf-string is also a valid JSON string of the same content (its only
// escapes, \" and \\, are JSON's, and it holds no control character), so
// a client reads the very names the RateLimit field carries.
func AppendViolated(b []byte, d *enforcement.Decision) []byte {
	b = append(b, '[')
	n := 0
	if HasPolicy(d) && d.Bucket.Remaining < d.Cost {
		b = appendString(b, d.Policy, "")
		n++
	}
	if d.Quota.Limit > 0 && d.Quota.Known && d.Quota.Remaining < d.Cost {
		if n > 0 {
			b = append(b, ',')
		}
		b = appendString(b, d.Policy, QuotaSuffix)
	}
	return append(b, ']')
}
