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
// Two words keep one meaning each. The mirror is the local tier's copy of
// what the shared store last said about a bucket (tokens left at a time,
// refilled at the true rate): it lets the local tier reject what the store
// would, without asking it. A shadow is a trial limit (a shadow rule, or a
// candidate policy in shadow), evaluated beside each decision and never
// enforced (ShadowEvaluator, Decision.Shadow).
//
// The package uses the standard library and the leaf package limits only;
// Redis, HTTP and metrics live in subpackages that depend on it, and the
// policy file in package policy, never the other way round.
package enforcement

import (
	"errors"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// The limit types live in the leaf package limits, shared with the policy
// file and the accounting side; these names keep the domain's vocabulary.
type (
	// Period is the calendar window of a quota, in UTC.
	Period = limits.Period
	// Limit is what one bucket enforces.
	Limit = limits.Limit
	// Resolved is a limit together with what the policy said about it.
	Resolved = limits.Resolved
)

// Quota periods. PeriodNone means the limit has no quota.
const (
	PeriodNone  = limits.PeriodNone
	PeriodHour  = limits.PeriodHour
	PeriodDay   = limits.PeriodDay
	PeriodMonth = limits.PeriodMonth
)

// Request asks whether a key may spend Cost tokens in Scope.
type Request struct {
	Key   string
	Scope string
	Tier  string // optional; empty = the policy's key-to-tier map, else the default tier
	Cost  int64  // tokens to spend; meaningful only when HasCost
	// HasCost distinguishes "cost 0" from "no cost given" (the scope's cost).
	HasCost bool
	// Reserve: the cost is an estimate, and an allowed decision keeps a
	// reservation (Decision.Reservation) that Limiter.Settle charges the
	// actual cost to.
	Reserve bool
	// Peek asks what the request would get without spending anything:
	// Check answers it as Limiter.Peek does (no write to the store, no
	// local tier charged, no decision recorded).
	Peek bool
	// Priority is the request's priority class on a concurrency limit
	// (policy priorities; "" = the default class). Only the slot layer
	// (enforcement/slots) reads it.
	Priority string
	// Domain is the Envoy rate limit domain the request came through (empty
	// for /check and the middleware). It plays no part in the decision; it
	// is recorded with it.
	Domain string
	// TraceID is the W3C trace id of the sampled trace the request rode in
	// (set by the transport; zero when none or not sampled). It plays no
	// part in the decision: the recorder puts it in the decision's event,
	// and the metrics link a latency bucket to it.
	TraceID [16]byte
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
	// SourceRegional: a global limit decided while its global budget could
	// not be reached, on the region's escrow share (enforcement/global).
	SourceRegional
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
	case SourceRegional:
		return "regional"
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
	// Shadow is the verdict of the shadow limit evaluated beside this
	// decision (Config.Shadow); zero when none applied. Never enforced.
	Shadow ShadowVerdict
	// Bucket and Quota report the token bucket and the calendar quota one
	// by one, where Limit, Remaining and ResetAt report whichever binds:
	// what a caller needs to advertise both (the RateLimit header fields).
	Bucket BucketState
	Quota  QuotaState
	// DecidedUS is, for a shared decision, the instant the store decided
	// on its own clock (Redis TIME; the bucket's instant), µs since the
	// Unix epoch; 0 for any other decision. The decision event carries it
	// so that a replay decides the bucket at the instant the store did,
	// not at the limiter's clock before the call.
	DecidedUS int64
	// Reservation is the id of the reservation an allowed decision with
	// Request.Reserve keeps (empty otherwise).
	Reservation string
	// Lease is the id of the slot an allowed decision on a concurrency
	// limit holds until it is released (enforcement/slots), and
	// LeaseExpiresAt when the slot returns by itself unless renewed;
	// empty and zero otherwise.
	Lease          string
	LeaseExpiresAt time.Time
	// Reason says why a rejection was made when it was not the rate
	// limit's own: ReasonConcurrency or ReasonShed; "" otherwise.
	Reason string
}

// Rejection reasons (Decision.Reason), as /check spells them.
const (
	// ReasonConcurrency: every slot of the key's concurrency limit is held.
	ReasonConcurrency = "concurrency"
	// ReasonShed: the request's priority class holds its whole share of
	// the concurrency limit; a higher class would have been admitted.
	ReasonShed = "shed"
)

// BucketState is the token bucket that decided, after the decision: the
// resolved one, or the tightened one when Source is SourceDegraded. Its
// zero value means the decision never reached a bucket.
type BucketState struct {
	Rate      float64   // refill, tokens per second
	Burst     int64     // capacity
	Remaining int64     // whole tokens left
	ResetAt   time.Time // when the bucket is full again
}

// QuotaState is the calendar quota of the limit, after the decision. Limit
// 0 means the limit has none. Known is false when the local tier decided
// before this instance had learned the window's spend: then Remaining and
// ResetAt are zero.
type QuotaState struct {
	Limit     int64  // tokens per window
	Period    Period // the calendar window
	Known     bool
	Remaining int64     // tokens left in the window
	ResetAt   time.Time // the window's end
}

// Errors a caller branches on.
var (
	// ErrCostExceedsLimit: the cost is larger than the bucket's capacity, so
	// the request could never be allowed.
	ErrCostExceedsLimit = errors.New("cost exceeds the bucket's capacity")
	// ErrInvalidRequest: the request is malformed (empty key or scope, negative cost).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrConcurrencyOnly: the key's limit is a concurrency limit alone,
	// which only the slot layer (enforcement/slots) decides; a door
	// without it cannot.
	ErrConcurrencyOnly = errors.New("the limit is a concurrency limit alone; this door does not take slots")
)
