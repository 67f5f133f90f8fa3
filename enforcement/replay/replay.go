// Package replay answers "what would this policy have done to traffic we
// already served?": recorded decisions (key, scope, tier, cost, time) are
// decided again under a candidate policy, with the limiter's own arithmetic
// — enforcement.MemoryAuthority, the in-process twin of the Redis script
// (the same Bucket.Take, the same calendar quotas), on a clock that is the
// recorded decision time — and the policy's own resolution (any Resolver;
// *policy.Policy is one). Nothing here is a second implementation of either,
// and nothing touches Redis.
//
// What a replay cannot know, and how it is treated (docs/policy-commands.md, "limiter policy replay"):
//   - the buckets' state before the first row: every bucket starts full;
//   - the local tier, leases, split sub-buckets and degraded decisions: the
//     replay decides every row as the shared store would, one bucket per
//     (key, scope), except that a rejection made without the store (source
//     local or degraded) spends nothing in the replay either: it changed no
//     bucket of the store (the candidate's verdict on it is whether its
//     bucket held the cost);
//   - whether the caller named the tier or cost: the recorded ones (after
//     defaults) are used, so a candidate's `keys` and `costs` maps change
//     nothing;
//   - the exact instant the store decided, for decisions recorded before
//     events carried it (decided_us): the recorded time is then the
//     limiter's, in ms, taken before the store call, and a decision within
//     Tolerance of a bucket boundary may go either way; Report.Agreement
//     separates those from real differences. A row with the instant
//     (Row.DecidedUS) is decided at it, so that under the policy in force
//     every recorded shared verdict is reproduced.
//
// Costs known only after the work (docs/reserve-settle.md) are replayed as
// the limiter spent them: a reserving decision reserves its estimate
// (MemoryAuthority.Reserve, under its recorded id), its settle moves the
// bucket and the quota by actual − estimate at the instant the store
// applied it (MemoryAuthority.Settle), and a charge spends its cost, debt
// allowed. So every request costs its actual cost, a reservation that
// expired unsettled its estimate, and a bucket in debt rejects what follows
// as it did. A settle whose reservation the replay does not hold changes
// nothing: the candidate rejected it (the request would not have run), or
// it was made before the range (whose buckets start full).
//
// A support reset of a key's quota (a row of kind reset) sets the
// candidate's quota counter of the key back to zero at the reset's time,
// as the store's was (MemoryAuthority.ResetQuota): the requests after it
// are decided on the quota as they were.
//
// An Engine is not safe for concurrent use: one goroutine feeds it rows in
// time order (per key at least).
package replay

import (
	"context"
	"sort"
	"strconv"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/limits"
)

// Row is one recorded decision, settle or charge.
type Row struct {
	TS      int64 // decision time, ms since the Unix epoch
	Key     string
	Scope   string
	Tier    string // the tier the decision resolved to
	Cost    int64  // the cost charged for (after the scope's default)
	Allowed bool   // what was answered (a dry-run decision was allowed)
	Source  string // local | shared | degraded
	Policy  string // the rule that decided
	DryRun  bool
	// DecidedUS is the instant the store decided a shared decision, µs
	// since the Unix epoch (Redis TIME); 0 when not recorded. The row's
	// bucket is decided at it instead of at TS. A settle's or a charge's
	// is the instant its store applied it.
	DecidedUS int64
	// Kind is KindSettle or KindCharge for a cost charged after the fact,
	// anything else (KindDecision, "") for a decision. A settle or a
	// charge is not a request and is in no decision count.
	Kind string
	// Reservation is the id of a reserving decision and of its settle.
	Reservation string
	// Priority is the request's priority class ("" when it named none):
	// the row is decided with the candidate's share of the bucket for it.
	Priority string
	// Estimate is a settle's estimate (its reservation's Cost); Actual
	// the actual cost of a settle or a charge.
	Estimate, Actual int64
}

// Row kinds (Row.Kind), as decisions_raw spells them.
const (
	KindDecision = "decision"
	KindSettle   = enforcement.KindSettle
	KindCharge   = enforcement.KindCharge
	// kindReset is a support reset's row (metering.KindReset).
	kindReset = "reset"
	// kindSlot is a slot decision that is no request (metering.KindSlot):
	// its request's rate decision is a row of its own.
	kindSlot = "slot"
)

// reservationTTL is how long the replay keeps an unsettled reservation:
// the longest LIMITER_RESERVATION_TTL. A recorded settle was applied
// within the TTL in force, so its reservation is still held here.
const reservationTTL = 24 * time.Hour

// Resolver resolves a request's limit; *policy.Policy is one.
type Resolver interface {
	Resolve(key, scope, tier string) (limits.Resolved, error)
}

// Config configures an Engine. The zero value of each optional field is a
// documented default.
type Config struct {
	// Policy is the candidate. Required.
	Policy Resolver
	// TopKeys is how many keys the report lists (default 10).
	TopKeys int
	// Tolerance is how close to a bucket boundary (in time: the tokens
	// above or below the cost ÷ the rate) a recorded shared decision may be
	// for a different replayed verdict to count as clock granularity, not
	// a difference (default 10 ms).
	Tolerance time.Duration
	// TopNewlyRejected ranks the report's keys by the decisions the
	// candidate newly rejects (allowed then), listing only those it newly
	// rejects; false ranks them by the candidate's rejections.
	TopNewlyRejected bool
	// MaxKeys bounds the keys tracked for the per-key report and the
	// buckets held (default 1,000,000). Keys first seen beyond it are
	// decided and counted in the totals, not listed.
	MaxKeys int
}

// Engine replays rows. The zero value is not usable; use New.
type Engine struct {
	cfg    Config
	shares enforcement.Shares // the candidate's priority classes
	now    time.Time
	auth   *enforcement.MemoryAuthority
	cache  map[reqID]resolved
	rules  map[string]*Counts
	keys   map[string]*KeyCounts
	total  Counts
	agree  Agreement
	// untracked counts rows of keys beyond MaxKeys.
	untracked int64
	lastSweep time.Time
	first     int64
	last      int64
	settled   Settlements
	cost      ActualCost
	charges   uint64 // ids of the replay's charges
	// quotaResets counts the support resets of a quota replayed.
	quotaResets int64
}

type reqID struct{ key, scope, tier string }

type resolved struct {
	res limits.Resolved
	err error
}

// Counts are decisions of one rule (or all): what was answered, and what
// the candidate would answer.
type Counts struct {
	Decisions         int64 `json:"decisions"`
	RecordedRejected  int64 `json:"recordedRejected"`
	Rejected          int64 `json:"rejected"`          // the candidate would reject (dry-run rules excluded)
	NewlyRejected     int64 `json:"newlyRejected"`     // allowed then, rejected by the candidate
	NewlyAllowed      int64 `json:"newlyAllowed"`      // rejected then, allowed by the candidate
	DryRunWouldReject int64 `json:"dryRunWouldReject"` // the candidate's dry-run rules would reject, and allow
}

// KeyCounts are one key's counts and the first moment the candidate would
// have limited it.
type KeyCounts struct {
	Key string `json:"key"`
	Counts
	FirstLimited time.Time `json:"firstLimited,omitzero"` // first decision the candidate rejects; zero = none
	// FirstRecordedLimited is the first decision that was rejected then.
	FirstRecordedLimited time.Time `json:"firstRecordedLimited,omitzero"`
}

// Agreement compares the recorded verdicts of shared decisions (the store
// decided; not dry run) with the replay's. It is the check that a replay
// under the policy that was in force reproduces what happened.
type Agreement struct {
	Compared           int64 `json:"compared"`
	Agree              int64 `json:"agree"`
	DifferWithinClock  int64 `json:"differWithinTolerance"` // within Tolerance of a bucket boundary
	DifferBeyondClock  int64 `json:"differBeyondTolerance"`
	ToleranceMicros    int64 `json:"toleranceMicros"`
	firstBeyondExample string
}

// Settlements counts the settle and charge rows replayed.
type Settlements struct {
	Settles int64 `json:"settles"`
	// Unmatched settles found no reservation the replay holds (the
	// candidate rejected it, it was made before the range, or the tier is
	// unknown to the candidate): they moved no bucket.
	Unmatched int64 `json:"settlesUnmatched"`
	Charges   int64 `json:"charges"`
}

// ActualCost is the tokens the traffic actually cost: Recorded as it was
// answered (the allowed decisions' costs, each settle's actual − estimate,
// each charge), Replayed under the candidate (the decisions it allows, the
// settles of the reservations it made, each charge its tier resolves).
// Under the policy in force, over a range that holds the reservations of
// its settles, the two are equal.
type ActualCost struct {
	Recorded int64 `json:"recorded"`
	Replayed int64 `json:"replayed"`
}

// Report is a replay's result.
type Report struct {
	Rows      int64              `json:"rows"`
	From      time.Time          `json:"firstDecision,omitzero"`
	To        time.Time          `json:"lastDecision,omitzero"`
	Total     Counts             `json:"total"`
	Rules     map[string]*Counts `json:"rules"`
	TopKeys   []KeyCounts        `json:"topKeys"`
	Keys      int                `json:"keysTracked"`
	Untracked int64              `json:"rowsOfUntrackedKeys"`
	Agreement Agreement          `json:"agreement"`
	// FirstDifference describes the first shared decision that differed
	// beyond the tolerance (for a replay under the policy in force).
	FirstDifference string `json:"firstDifference,omitempty"`
	// Settlements are the settle and charge rows (not in Rows), and
	// ActualCost what the traffic cost then and under the candidate.
	Settlements Settlements `json:"settlements"`
	ActualCost  ActualCost  `json:"actualCost"`
	// QuotaResets are the support resets of a quota replayed (rows of
	// kind reset, not in Rows): each set the candidate's quota counter of
	// its key back to zero.
	QuotaResets int64 `json:"quotaResets"`
}

// New returns an Engine.
func New(cfg Config) *Engine {
	if cfg.TopKeys <= 0 {
		cfg.TopKeys = 10
	}
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = 10 * time.Millisecond
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 1_000_000
	}
	e := &Engine{cfg: cfg, cache: map[reqID]resolved{}, rules: map[string]*Counts{}, keys: map[string]*KeyCounts{}}
	e.shares = enforcement.SharesOf(cfg.Policy)
	// The authority's clock is the recorded decision time.
	e.auth = enforcement.NewMemoryAuthority(func() time.Time { return e.now }, cfg.MaxKeys)
	e.agree.ToleranceMicros = cfg.Tolerance.Microseconds()
	return e
}

// unresolvable names the rule of a row the candidate cannot resolve (a
// tier it does not define): it would refuse the request.
const unresolvable = "(unknown tier)"

// unknownClass names the rule of a row whose priority class the candidate
// does not define: it would refuse the request.
const unknownClass = "(unknown priority class)"

// Add replays one row.
func (e *Engine) Add(r Row) {
	at := time.UnixMilli(r.TS).UTC()
	e.setClock(at, r.DecidedUS)
	if r.Kind == KindSettle || r.Kind == KindCharge {
		e.settle(&r)
		return
	}
	if r.Kind == kindReset {
		e.resetQuota(&r)
		return
	}
	if r.Kind == kindSlot {
		return // a slot beside a rate: no request, nothing to decide again
	}
	if e.total.Decisions == 0 || r.TS < e.first {
		e.first = r.TS
	}
	e.last = max(e.last, r.TS)
	rs := e.resolve(r.Key, r.Scope, r.Tier)
	rule := unresolvable
	wouldAllow, dryRun := false, false
	distance := time.Duration(-1) // how far from the bucket boundary; -1 = not a bucket question
	share, classErr := e.shares.Of(r.Priority)
	known := classErr == nil
	if rs.err == nil && !known {
		rule = unknownClass
	}
	if rs.err == nil && known {
		res := rs.res
		res.Limit.Share = share
		rule, dryRun = res.Policy, res.DryRun
		switch {
		case !res.HasRate():
			// A concurrency alone bounds requests in flight, which the
			// recorded decisions do not show (nor when each ended): the
			// candidate has no rate to refuse them by.
			wouldAllow = true
		case r.Cost > res.Capacity():
		case !r.Allowed && r.Source != enforcement.SourceShared.String():
			// Rejected without the store (the local tier knew the bucket
			// was empty, on its own clock and a response's latency late):
			// the store's buckets did not change, so the replay's do not
			// either. It asks, without spending, whether the candidate's
			// bucket and quota held the cost then.
			v, _ := e.auth.Take(context.Background(), r.Key, r.Scope, res.Limit, 0)
			lim := res.Limit
			wouldAllow = v.Remaining >= r.Cost && (!lim.HasQuota() || v.QuotaUsed+r.Cost <= lim.QuotaLimit)
		default:
			// MemoryAuthority never fails; its error is always nil. A
			// reservation keeps a record under its recorded id, which its
			// settle finds.
			var v enforcement.Verdict
			if r.Reservation != "" {
				v, _ = e.auth.Reserve(context.Background(), r.Key, r.Scope, res.Limit, r.Cost, r.Reservation, reservationTTL)
			} else {
				v, _ = e.auth.Take(context.Background(), r.Key, r.Scope, res.Limit, r.Cost)
			}
			wouldAllow = v.Allowed
			distance = boundaryDistance(res.Limit, r.Cost, v)
		}
	}
	rejected := !wouldAllow && !dryRun
	recordedRejected := !r.Allowed
	if !recordedRejected {
		e.cost.Recorded += r.Cost
	}
	if !rejected && rs.err == nil && known {
		e.cost.Replayed += r.Cost
	}

	c := e.rules[rule]
	if c == nil {
		c = &Counts{}
		e.rules[rule] = c
	}
	k := e.keys[r.Key]
	if k == nil && len(e.keys) < e.cfg.MaxKeys {
		k = &KeyCounts{Key: r.Key}
		e.keys[r.Key] = k
	}
	if k == nil {
		e.untracked++
	}
	for _, cc := range []*Counts{&e.total, c, keyCounts(k)} {
		if cc == nil {
			continue
		}
		cc.Decisions++
		if recordedRejected {
			cc.RecordedRejected++
		}
		if rejected {
			cc.Rejected++
		}
		if rejected && !recordedRejected {
			cc.NewlyRejected++
		}
		if !rejected && recordedRejected {
			cc.NewlyAllowed++
		}
		if dryRun && !wouldAllow {
			cc.DryRunWouldReject++
		}
	}
	if k != nil {
		if rejected && k.FirstLimited.IsZero() {
			k.FirstLimited = at
		}
		if recordedRejected && k.FirstRecordedLimited.IsZero() {
			k.FirstRecordedLimited = at
		}
	}
	if r.Source == enforcement.SourceShared.String() && !r.DryRun {
		e.agree.Compared++
		switch {
		case wouldAllow == r.Allowed:
			e.agree.Agree++
		case distance >= 0 && distance <= e.cfg.Tolerance:
			e.agree.DifferWithinClock++
		default:
			e.agree.DifferBeyondClock++
			if e.agree.firstBeyondExample == "" {
				e.agree.firstBeyondExample = at.Format(time.RFC3339Nano) + " key " + r.Key + " scope " + r.Scope +
					": recorded " + verdict(r.Allowed) + ", replayed " + verdict(wouldAllow)
			}
		}
	}
}

// setClock sets the authority's clock to a row's instant: the store's when
// recorded, else the recorded time (a key's rows arrive in order; a row
// earlier than its bucket's last update is clamped by the bucket, as a
// clock step back is in the store).
func (e *Engine) setClock(at time.Time, decidedUS int64) {
	e.now = at
	if decidedUS > 0 {
		e.now = time.UnixMicro(decidedUS).UTC()
	}
	if e.now.Sub(e.lastSweep) > 10*time.Second {
		// Full buckets, ended quota windows and expired reservations
		// restart as they are: what bounds memory over a long replay.
		e.auth.Sweep(e.now)
		e.lastSweep = e.now
	}
}

// resolve is the candidate's limit of a request, cached.
func (e *Engine) resolve(key, scope, tier string) resolved {
	id := reqID{key, scope, tier}
	rs, ok := e.cache[id]
	if !ok {
		if len(e.cache) >= e.cfg.MaxKeys {
			clear(e.cache)
		}
		rs.res, rs.err = e.cfg.Policy.Resolve(key, scope, tier)
		e.cache[id] = rs
	}
	return rs
}

// settle replays a settle or a charge on the candidate's bucket, by the
// limiter's own Settle: a settle moves its reservation's bucket by actual −
// estimate, a charge (a settle of a fresh id with no record) spends its
// cost, both into debt if need be.
func (e *Engine) settle(r *Row) {
	var id string
	if r.Kind == KindSettle {
		e.settled.Settles++
		e.cost.Recorded += r.Actual - r.Estimate
		id = r.Reservation
	} else {
		e.settled.Charges++
		e.cost.Recorded += r.Actual
		e.charges++
		id = "charge " + strconv.FormatUint(e.charges, 10)
	}
	rs := e.resolve(r.Key, r.Scope, r.Tier)
	if rs.err != nil {
		if r.Kind == KindSettle {
			e.settled.Unmatched++
		}
		return
	}
	// The record, or the charge's marker, is kept for no time: the raw
	// table holds each settle once, so none comes again.
	s, err := e.auth.Settle(context.Background(), r.Key, r.Scope, id, rs.res.Limit, r.Actual, r.Kind == KindCharge, time.Nanosecond)
	if err != nil {
		e.settled.Unmatched++
		return
	}
	e.cost.Replayed += s.Charged - s.Estimate
}

// resetQuota replays a support reset of a key's quota: the candidate's
// quota counter of the key (the limit its tier resolves to) goes back to
// zero at the reset's instant, as the store's did, so the requests after
// it are decided on the quota as they were. A tier the candidate does not
// define, or a limit without a quota, has nothing to reset.
func (e *Engine) resetQuota(r *Row) {
	rs := e.resolve(r.Key, r.Scope, r.Tier)
	if rs.err != nil || !rs.res.HasQuota() {
		return
	}
	e.auth.ResetQuota(r.Key, rs.res.Limit)
	e.quotaResets++
}

func keyCounts(k *KeyCounts) *Counts {
	if k == nil {
		return nil
	}
	return &k.Counts
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "rejected"
}

// boundaryDistance is how far in time the decision was from going the
// other way on the bucket: for an allowed cost, the tokens left ÷ the rate;
// for a rejection, the wait until the cost is there. A rejection by the
// quota (a wait to the window's end) is far from any clock question.
func boundaryDistance(lim limits.Limit, cost int64, v enforcement.Verdict) time.Duration {
	if lim.Rate <= 0 {
		return -1
	}
	if v.Allowed {
		left := float64(lim.Burst) - v.ResetAfter.Seconds()*lim.Rate // tokens after spending cost
		return time.Duration(left / lim.Rate * float64(time.Second))
	}
	return v.RetryAfter
}

// Report returns the counts so far; the engine may go on.
func (e *Engine) Report() Report {
	rep := Report{
		Rows: e.total.Decisions, Total: e.total, Rules: map[string]*Counts{},
		Keys: len(e.keys), Untracked: e.untracked, Agreement: e.agree,
		FirstDifference: e.agree.firstBeyondExample,
		Settlements:     e.settled,
		ActualCost:      e.cost,
		QuotaResets:     e.quotaResets,
	}
	if e.total.Decisions > 0 {
		rep.From, rep.To = time.UnixMilli(e.first).UTC(), time.UnixMilli(e.last).UTC()
	}
	for name, c := range e.rules {
		cc := *c
		rep.Rules[name] = &cc
	}
	top := make([]KeyCounts, 0, len(e.keys))
	for _, k := range e.keys {
		if e.cfg.TopNewlyRejected && k.NewlyRejected > 0 || !e.cfg.TopNewlyRejected && (k.Rejected > 0 || k.RecordedRejected > 0) {
			top = append(top, *k)
		}
	}
	// The keys the candidate limits most, then the ones it newly limits
	// (or those it newly limits most, then the most limited).
	sort.Slice(top, func(i, j int) bool {
		a, b := top[i], top[j]
		if e.cfg.TopNewlyRejected && a.NewlyRejected != b.NewlyRejected {
			return a.NewlyRejected > b.NewlyRejected
		}
		if a.Rejected != b.Rejected {
			return a.Rejected > b.Rejected
		}
		if a.NewlyRejected != b.NewlyRejected {
			return a.NewlyRejected > b.NewlyRejected
		}
		return a.Key < b.Key
	})
	if len(top) > e.cfg.TopKeys {
		top = top[:e.cfg.TopKeys]
	}
	rep.TopKeys = top
	return rep
}
