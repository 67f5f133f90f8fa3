// Package shadow evaluates shadow limits beside enforcement: a trial limit
// (a policy rule marked `shadow: true`, or every rule of a whole candidate
// policy file) is decided next to the enforced one on every decision it
// covers, in its own bucket state, and its verdict is reported
// (Decision.Shadow, metrics, the decision event) but never enforced.
//
// Design: an Evaluator is a second enforcement.Limiter — the same local
// tier, the same token-bucket arithmetic and the same store script — whose
// policy resolves the shadow limit, and whose authority is a store in its
// own namespace (its own Redis key prefix, or its own in-process buckets),
// behind its own deadline and circuit breaker. So the shadow can never
// spend the enforced bucket or quota, and a slow or failing shadow store
// never opens the enforced breaker. The enforced decision is final before
// the shadow is asked; a shadow that cannot decide (store failure, breaker
// open, an error) gives no verdict and is counted, and the enforced
// decision goes out unchanged. Floods on a key that the shadow limit
// rejects are rejected by the shadow's own local tier with no store call.
//
// The cost: decisions no shadow limit covers pay one pointer check (no
// shadow rules) or one policy resolution; covered ones pay a shadow
// decision, at most one store round trip bounded by its deadline, and none
// when the shadow limit equals the enforced one (the enforced verdict is
// mirrored: the two buckets would be the same bucket).
package shadow

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/limits"
)

// Resolver is what an enforced policy offers for shadow rules
// (*policy.Policy is one).
type Resolver interface {
	HasShadow() bool
	ResolveShadow(key, scope, tier string) (limits.Resolved, bool, error)
}

// Observer counts shadow outcomes. Implementations must be safe for
// concurrent use and cheap.
type Observer interface {
	// Evaluated: the shadow limit name decided; wouldAllow is its verdict,
	// allowed what the caller was answered (the enforced decision): a
	// would-be rejection of an allowed decision is what enforcing the
	// shadow limit would newly reject.
	Evaluated(name string, wouldAllow, allowed bool)
	// Unavailable: a shadow limit applied but could not decide (reason:
	// "store" — the shadow store failed or its breaker is open — or
	// "error"); the decision carries no shadow verdict.
	Unavailable(reason string)
}

// Config configures an Evaluator. The zero value of each optional field is
// a documented default.
type Config struct {
	// Authority is the shadow tier's store: a namespace of its own (never
	// the enforced buckets), with its own deadline and breaker. Required.
	Authority enforcement.Authority
	// Candidate, when set, is a whole candidate policy: every decision is
	// evaluated under it as well (its Resolve), and the enforced policy's
	// shadow rules are not consulted. Nil = the shadow rules of the
	// enforced policy in force (followed across reloads). SetCandidate
	// replaces it (a reload of the candidate file).
	Candidate enforcement.Policy
	// ExpectedInstances, LocalHeadroom, MaxKeys and MaxBytes size the
	// shadow's local tier as the enforced limiter's are sized (same
	// defaults).
	ExpectedInstances int
	LocalHeadroom     float64
	MaxKeys           int
	MaxBytes          int64
	// Timeout bounds one shadow decision end to end (default 50 ms); the
	// authority's own deadline is normally much shorter.
	Timeout time.Duration
	// Observer is optional.
	Observer Observer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Evaluator implements enforcement.ShadowEvaluator. It is safe for
// concurrent use; Run does its background work.
type Evaluator struct {
	cfg   Config
	inner *enforcement.Limiter
	// held is what the inner limiter's policy was last set to: a
	// candidate's ref, or (rules set) the enforced policy whose shadow
	// rules it resolves. A reload of the enforced policy (new pointer)
	// rebuilds it, so the inner entries re-resolve as the enforced ones
	// do; a decision that finds another shadow policy in force sets it
	// (under mu, so that held always names what the inner limiter holds).
	held atomic.Pointer[policyRef]
	mu   sync.Mutex
	// candidate is Config.Candidate as last set (nil: none).
	candidate atomic.Pointer[policyRef]
	// rollout is the candidate of an open rollout of the policy log (nil:
	// none); while set it is the shadow policy, ahead of the others.
	rollout atomic.Pointer[policyRef]
}

// policyRef is a shadow policy; rollout is the revision of the rollout it
// is the candidate of (0 = none).
type policyRef struct {
	p       enforcement.Policy
	rollout int64
	rules   bool // p is an enforced policy; its shadow rules are the shadow policy
}

var _ enforcement.ShadowEvaluator = (*Evaluator)(nil)

// errNoShadow: no shadow limit covers the request (never surfaces: the
// evaluator checks coverage before asking the inner limiter).
var errNoShadow = errors.New("shadow: no shadow limit applies")

// rulesOf resolves the shadow rules of one enforced policy.
type rulesOf struct{ r Resolver }

func (s rulesOf) Resolve(key, scope, tier string) (limits.Resolved, error) {
	res, ok, err := s.r.ResolveShadow(key, scope, tier)
	if err == nil && !ok {
		err = errNoShadow
	}
	return res, err
}

// none is the inner policy before the first enforced policy is seen.
type none struct{}

func (none) Resolve(string, string, string) (limits.Resolved, error) {
	return limits.Resolved{}, errNoShadow
}

// New returns an Evaluator. It starts nothing (Run).
func New(cfg Config) (*Evaluator, error) {
	if cfg.Authority == nil {
		return nil, errors.New("shadow: Config.Authority is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 50 * time.Millisecond
	}
	var initial enforcement.Policy = none{}
	if cfg.Candidate != nil {
		initial = cfg.Candidate
	}
	inner, err := enforcement.New(enforcement.Config{
		Authority:         cfg.Authority,
		Policy:            initial,
		ExpectedInstances: cfg.ExpectedInstances,
		LocalHeadroom:     cfg.LocalHeadroom,
		MaxKeys:           cfg.MaxKeys,
		MaxBytes:          cfg.MaxBytes,
		Now:               cfg.Now,
	})
	if err != nil {
		return nil, err
	}
	e := &Evaluator{cfg: cfg, inner: inner}
	if cfg.Candidate != nil {
		e.candidate.Store(&policyRef{p: cfg.Candidate})
	}
	return e, nil
}

// SetCandidate replaces the candidate policy (a reload of the candidate
// file). Only an Evaluator made with a candidate has one to replace: the
// shadow rules of an enforced policy follow that policy's own reloads.
// Shadow buckets of limits the new candidate keeps are kept (same bucket
// key, as for the enforced limiter's reloads).
func (e *Evaluator) SetCandidate(p enforcement.Policy) {
	if p == nil || e.candidate.Load() == nil {
		return
	}
	e.candidate.Store(&policyRef{p: p})
}

// SetRollout makes p, the candidate of rollout rev of the policy log, the
// shadow policy of every decision (the verdicts carry rev), ahead of a
// candidate file and of shadow rules; nil ends it, and the shadow policy
// is again what it was. Its caller is the one reader of the policy log; a
// decision evaluated while the rollout changes may be decided under
// either, which only blurs the edge of the rollout's window.
func (e *Evaluator) SetRollout(p enforcement.Policy, rev int64) {
	if p == nil {
		e.rollout.Store(nil)
		return
	}
	e.rollout.Store(&policyRef{p: p, rollout: rev})
}

// SetInstances follows the fleet's live count, as the enforced limiter does.
func (e *Evaluator) SetInstances(n int) { e.inner.SetInstances(n) }

// Run does the inner limiter's background work until ctx ends
// (enforcement.Limiter.Run).
func (e *Evaluator) Run(ctx context.Context) error { return e.inner.Run(ctx) }

// Evaluate implements enforcement.ShadowEvaluator.
func (e *Evaluator) Evaluate(p enforcement.Policy, req enforcement.Request, d enforcement.Decision, _ time.Time) enforcement.ShadowVerdict {
	var res limits.Resolved
	var rollout int64
	cand := e.rollout.Load()
	if cand == nil {
		cand = e.candidate.Load()
	}
	if cand != nil {
		rollout = cand.rollout
		if e.held.Load() != cand {
			e.hold(cand, func(ref *policyRef) bool { return ref == cand })
		}
		r, err := cand.p.Resolve(req.Key, req.Scope, req.Tier)
		if err != nil {
			// The candidate cannot decide this request at all (e.g. a
			// tier it does not define): it would refuse it.
			e.evaluated(refusedByCandidate, false, d.Allowed)
			return enforcement.ShadowVerdict{Name: refusedByCandidate, WouldAllow: false, Rollout: rollout}
		}
		res = r
	} else {
		sr, ok := p.(Resolver)
		if !ok || !sr.HasShadow() {
			return enforcement.ShadowVerdict{}
		}
		r, covered, err := sr.ResolveShadow(req.Key, req.Scope, req.Tier)
		if err != nil || !covered {
			return enforcement.ShadowVerdict{} // an enforced error never gets here
		}
		res = r
		rules := rulesOf{sr}
		if ref := e.held.Load(); ref == nil || !ref.rules || ref.p != rules {
			e.hold(&policyRef{p: rules, rules: true}, func(ref *policyRef) bool { return ref != nil && ref.rules && ref.p == rules })
		}
	}
	if same(p, req, res) {
		// The shadow bucket would be the enforced bucket: mirror it — unless
		// the enforced verdict is itself a degraded guess.
		if d.Source == enforcement.SourceDegraded {
			e.unavailable("store")
			return enforcement.ShadowVerdict{}
		}
		e.evaluated(res.Policy, d.WouldAllow, d.Allowed)
		return enforcement.ShadowVerdict{Name: res.Policy, WouldAllow: d.WouldAllow, Rollout: rollout}
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	sd, err := e.inner.Check(ctx, req)
	switch {
	case errors.Is(err, enforcement.ErrCostExceedsLimit):
		// Under the shadow limit this request could never be allowed.
		e.evaluated(res.Policy, false, d.Allowed)
		return enforcement.ShadowVerdict{Name: res.Policy, WouldAllow: false, Rollout: rollout}
	case err != nil:
		e.unavailable("error")
		return enforcement.ShadowVerdict{}
	case sd.Source == enforcement.SourceDegraded:
		// The shadow store could not be asked: a degraded guess is not a
		// verdict worth reporting.
		e.unavailable("store")
		return enforcement.ShadowVerdict{}
	}
	e.evaluated(sd.Policy, sd.WouldAllow, d.Allowed)
	return enforcement.ShadowVerdict{Name: sd.Policy, WouldAllow: sd.WouldAllow, Rollout: rollout}
}

// hold sets the inner limiter's policy to ref's unless held already
// matches.
func (e *Evaluator) hold(ref *policyRef, matches func(*policyRef) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if matches(e.held.Load()) {
		return
	}
	e.inner.SetPolicy(ref.p)
	e.held.Store(ref)
}

// same reports whether the shadow limit is exactly the limit the enforced
// policy gives the request (same rate, burst, quota and quota owner): the
// shadow bucket would then evolve exactly as the enforced one, so its
// verdict is the enforced one, with no second store call.
func same(p enforcement.Policy, req enforcement.Request, res limits.Resolved) bool {
	enf, err := p.Resolve(req.Key, req.Scope, req.Tier)
	return err == nil && enf.Limit == res.Limit && enf.Cost == res.Cost
}

// refusedByCandidate names the verdict of a request the candidate policy
// cannot resolve at all (a tier it does not define): it would answer 400.
const refusedByCandidate = "candidate:refused"

func (e *Evaluator) evaluated(name string, wouldAllow, allowed bool) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.Evaluated(name, wouldAllow, allowed)
	}
}

func (e *Evaluator) unavailable(reason string) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.Unavailable(reason)
	}
}
