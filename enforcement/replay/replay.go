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
// An Engine is not safe for concurrent use: one goroutine feeds it rows in
// time order (per key at least).
package replay

import (
	"context"
	"sort"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/limits"
)

// Row is one recorded decision.
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
	// bucket is decided at it instead of at TS.
	DecidedUS int64
}

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
	cfg   Config
	now   time.Time
	auth  *enforcement.MemoryAuthority
	cache map[reqID]resolved
	rules map[string]*Counts
	keys  map[string]*KeyCounts
	total Counts
	agree Agreement
	// untracked counts rows of keys beyond MaxKeys.
	untracked int64
	lastSweep time.Time
	first     int64
	last      int64
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
	// The authority's clock is the recorded decision time.
	e.auth = enforcement.NewMemoryAuthority(func() time.Time { return e.now }, cfg.MaxKeys)
	e.agree.ToleranceMicros = cfg.Tolerance.Microseconds()
	return e
}

// unresolvable names the rule of a row the candidate cannot resolve (a
// tier it does not define): it would refuse the request.
const unresolvable = "(unknown tier)"

// Add replays one row.
func (e *Engine) Add(r Row) {
	at := time.UnixMilli(r.TS).UTC()
	if e.total.Decisions == 0 || r.TS < e.first {
		e.first = r.TS
	}
	e.last = max(e.last, r.TS)
	// Each row is decided at its own recorded time, the store's when
	// recorded (a key's rows arrive in order; a row earlier than its
	// bucket's last update is clamped by the bucket, as a clock step back
	// is in the store).
	e.now = at
	if r.DecidedUS > 0 {
		e.now = time.UnixMicro(r.DecidedUS).UTC()
	}
	if e.now.Sub(e.lastSweep) > 10*time.Second {
		// Full buckets and ended quota windows restart as they are: what
		// bounds memory over a long replay.
		e.auth.Sweep(e.now)
		e.lastSweep = e.now
	}
	id := reqID{r.Key, r.Scope, r.Tier}
	rs, ok := e.cache[id]
	if !ok {
		if len(e.cache) >= e.cfg.MaxKeys {
			clear(e.cache)
		}
		rs.res, rs.err = e.cfg.Policy.Resolve(r.Key, r.Scope, r.Tier)
		e.cache[id] = rs
	}
	rule := unresolvable
	wouldAllow, dryRun := false, false
	distance := time.Duration(-1) // how far from the bucket boundary; -1 = not a bucket question
	if rs.err == nil {
		res := rs.res
		rule, dryRun = res.Policy, res.DryRun
		switch {
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
			// MemoryAuthority never fails; its error is always nil.
			v, _ := e.auth.Take(context.Background(), r.Key, r.Scope, res.Limit, r.Cost)
			wouldAllow = v.Allowed
			distance = boundaryDistance(res.Limit, r.Cost, v)
		}
	}
	rejected := !wouldAllow && !dryRun
	recordedRejected := !r.Allowed

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
