package policy

import "github.com/ratewarden/ratewarden/limits"

// Shadow rules (`shadow: true`) are trials of a limit beside enforcement.
// Resolve never picks one; ResolveShadow answers "what limit would apply
// if the shadow rules were enforced": every rule competes in the usual
// order, a shadow rule winning ties against an enforced rule of the same
// specificity (promoting it would replace that rule). When the winner is a
// shadow rule, its limit is the shadow limit of the request; otherwise the
// shadow rules do not change this request and there is nothing to trial.

// HasShadow reports whether some rule is marked shadow. When it is false
// ResolveShadow never finds anything, so callers skip it.
func (p *Policy) HasShadow() bool { return p.hasShadow }

// ResolveShadow returns the limit of (key, scope, tier) with the shadow
// rules enforced, and ok = true when a shadow rule wins. The Resolved is
// built exactly as Resolve builds one (tier inheritance, the rule's quota
// under its own QuotaID, the global ceiling); its Policy is the shadow
// rule's name. Safe for concurrent use.
func (p *Policy) ResolveShadow(key, scope, tier string) (res limits.Resolved, ok bool, err error) {
	if !p.hasShadow {
		return limits.Resolved{}, false, nil
	}
	res, r, err := p.resolve(key, scope, tier, true)
	if err != nil || r == nil || !r.Shadow {
		return limits.Resolved{}, false, err
	}
	return res, true, nil
}
