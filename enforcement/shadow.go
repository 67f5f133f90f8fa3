package enforcement

import "time"

// ShadowVerdict is what a shadow limit (a trial limit evaluated beside the
// enforced one, in its own bucket state) would have decided. It is
// reported, never enforced. The zero value means no shadow limit applied.
type ShadowVerdict struct {
	Name       string // the shadow rule (or candidate policy's rule) evaluated; "" = none
	WouldAllow bool   // what the shadow limit would have decided
	// Rollout is the policy log's revision of the rollout whose candidate
	// decided (0 = a shadow rule, or a candidate file).
	Rollout int64
}

// ShadowEvaluator evaluates shadow limits beside enforcement (package
// enforcement/shadow is one). The limiter calls it once per decision,
// after the enforced decision is final and before the decision is observed
// and recorded, with the policy in force; it must be safe for concurrent
// use, must not change the enforced decision, and must bound its own time:
// a shadow that cannot decide returns the zero verdict.
type ShadowEvaluator interface {
	Evaluate(p Policy, req Request, d Decision, at time.Time) ShadowVerdict
}
