package support

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

// Local is what GET /admin/keys/local reads on this limiter.
type Local struct {
	Limiter  *enforcement.Limiter
	Instance string
	// Policy is the policy information /readyz shows (revision, source).
	Policy func() policylog.Info
	// Lease, optional, is what this limiter holds leased of a key.
	Lease func(key, scope string) (lease.Held, bool)
	// Global, optional, reads a global key's pool in this limiter's region
	// and its global bucket at the home (false: no regions here).
	Global func(ctx context.Context, key, scope string, lim enforcement.Limit) (global.View, bool)
}

// GlobalTimeout bounds a limiter's read of a global key's pool and
// global bucket (the home is across the WAN).
const GlobalTimeout = 2 * time.Second

// LocalHandler serves GET /admin/keys/local?key=K&scope=S: this limiter's
// rule for the key and its local tier's view (LocalAnswer). The caller
// puts it behind the admin token.
func LocalHandler(l Local) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, scope, ok := keyScope(w, r)
		if !ok {
			return
		}
		a := LocalAnswer{Instance: l.Instance, View: l.Limiter.LocalView(key, scope)}
		if l.Policy != nil {
			a.Policy = l.Policy()
		}
		if l.Lease != nil {
			if h, ok := l.Lease(key, scope); ok {
				a.Lease = &h
			}
		}
		rule, err := RuleFor(l.Limiter.Policy(), key, scope)
		if err != nil {
			a.RuleErr = err.Error()
		} else {
			a.Rule = rule
		}
		if rule != nil && rule.Global && l.Global != nil {
			ctx, cancel := context.WithTimeout(r.Context(), GlobalTimeout)
			if v, ok := l.Global(ctx, key, scope, rule.Limit); ok {
				a.Global = &v
			}
			cancel()
		}
		writeJSON(w, http.StatusOK, a)
	})
}

// RuleFor is the rule p applies to (key, scope), explained when p is a
// policy file's (*policy.Policy).
func RuleFor(p enforcement.Policy, key, scope string) (*Rule, error) {
	res, err := p.Resolve(key, scope, "")
	if err != nil {
		return nil, err
	}
	explain := ""
	var ov *OverrideRef
	switch pp := p.(type) {
	case *policy.Policy:
		explain = policy.Explain(pp, key, scope, "")
	case *policy.WithOverrides:
		explain = policy.Explain(pp.Policy, key, scope, "")
		for _, k := range []policy.OverrideKey{{Key: key, Scope: scope}, {Key: key}} {
			if tag, ok := pp.Overrides().Tag(k); ok {
				ov = &OverrideRef{Key: k.Key, Scope: k.Scope, Revision: tag.Revision, Author: tag.Author, Reason: tag.Reason, Message: tag.Message}
				by := "`limiter override get " + k.Key + "` shows its author and reason"
				if tag.Reason != "" {
					by = fmt.Sprintf("set by %s: %q", tag.Author, tag.Reason)
				}
				explain = fmt.Sprintf("override of %s (scope %q) in force, from policy log revision %d, ahead of every rule (%s); the document alone would say:\n%s",
					k.Key, k.Scope, tag.Revision, by, explain)
				break
			}
		}
	}
	r := RuleOf(res, explain)
	r.Override = ov
	return &r, nil
}

// InspectHandler serves GET /admin/keys/inspect?key=K&scope=S: the
// Report. Behind the admin token.
func InspectHandler(in *Inspector) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, scope, ok := keyScope(w, r)
		if !ok {
			return
		}
		writeJSON(w, http.StatusOK, in.Inspect(r.Context(), key, scope))
	})
}

// ResetHandler serves POST /admin/keys/reset {"doc","sig"}: 200 with the
// audit record when applied; a refusal is 400 (invalid, no reason), 403
// (unauthenticated, forbidden, stale, no keyring), 409 (replayed) or 503
// (the store), with its code and the audit record. Behind the admin
// token: the token lets a caller ask, the signature says who asks.
func ResetHandler(rs *Resetter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sr SignedReset
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err == nil {
			err = json.Unmarshal(body, &sr)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalid, "body is not {\"doc\",\"sig\"}: "+err.Error(), nil)
			return
		}
		rec, err := rs.Apply(r.Context(), sr)
		var ref *Refused
		if errors.As(err, &ref) {
			status := http.StatusForbidden
			switch ref.Code {
			case CodeInvalid, CodeReasonRequired:
				status = http.StatusBadRequest
			case CodeReplayed:
				status = http.StatusConflict
			case CodeUnavailable:
				status = http.StatusServiceUnavailable
			}
			writeError(w, status, ref.Code, ref.Reason, rec)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"result": "applied", "record": rec})
	})
}

func keyScope(w http.ResponseWriter, r *http.Request) (key, scope string, ok bool) {
	key, scope = r.URL.Query().Get("key"), r.URL.Query().Get("scope")
	if key == "" || scope == "" {
		writeError(w, http.StatusBadRequest, CodeInvalid, "key and scope are required", nil)
		return "", "", false
	}
	return key, scope, true
}

func writeError(w http.ResponseWriter, status int, code, msg string, rec json.RawMessage) {
	body := map[string]any{"result": "refused", "error": map[string]string{"code": code, "message": msg}}
	if rec != nil {
		body["record"] = rec
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
