package support

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policylog"
)

// Operator is who asks the desk, as the usage API's credentials say.
type Operator struct {
	Identity string
	// MayReset: the credential's role may change a key's state (a read
	// credential may only find and inspect).
	MayReset bool
}

// Desk is the support page's API on the usage API (docs/support.md,
// "The support page"): find a key, inspect it with the same Inspector as
// the limiter's admin API, and reset it, signed with the usage API's own
// key for the operator whose credential asked and applied by the fleet's
// first limiter that answers, as `limiter key reset` does. Safe for
// concurrent use once built.
type Desk struct {
	Inspector *Inspector
	// Signer signs resets (POLICY_SIGNING_KEY_FILE); nil answers resets
	// 503.
	Signer *policylog.Signer
	// Authenticate says who a request is; false answers 401.
	Authenticate func(*http.Request) (Operator, bool)
	// Instance names the desk in the audit of a reset it refuses itself.
	Instance string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// DeskRoutes are the paths Desk serves.
func DeskRoutes() []string {
	return []string{"/v1/admin/keys/search", "/v1/admin/keys/inspect", "/v1/admin/keys/reset"}
}

// DeskOperations are Desk's routes as "METHOD /path".
func DeskOperations() []string {
	return []string{"GET /v1/admin/keys/search", "GET /v1/admin/keys/inspect", "POST /v1/admin/keys/reset"}
}

// DeskResetBody is POST /v1/admin/keys/reset's body.
type DeskResetBody struct {
	Key    string             `json:"key"`
	Scope  string             `json:"scope"`
	Op     redisstore.ResetOp `json:"op"`
	Grant  int64              `json:"grant,omitempty"`
	Reason string             `json:"reason"`
}

func (d *Desk) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// ServeHTTP routes DeskRoutes.
func (d *Desk) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op, ok := d.Authenticate(r)
	if !ok {
		deskError(w, http.StatusUnauthorized, "unauthorized", "this endpoint needs an operator's bearer token (USAGE_ADMIN_TOKEN or USAGE_ADMIN_TOKENS_FILE)")
		return
	}
	switch {
	case r.URL.Path == "/v1/admin/keys/search" && r.Method == http.MethodGet:
		d.search(w, r)
	case r.URL.Path == "/v1/admin/keys/inspect" && r.Method == http.MethodGet:
		key, scope := r.URL.Query().Get("key"), r.URL.Query().Get("scope")
		if key == "" || scope == "" {
			deskError(w, http.StatusBadRequest, CodeInvalid, "key and scope are required")
			return
		}
		writeJSON(w, http.StatusOK, d.Inspector.Inspect(r.Context(), key, scope))
	case r.URL.Path == "/v1/admin/keys/reset" && r.Method == http.MethodPost:
		d.reset(w, r, op)
	default:
		deskError(w, http.StatusNotFound, "not_found", r.Method+" "+r.URL.Path+" is not a route")
	}
}

func (d *Desk) search(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" {
		deskError(w, http.StatusBadRequest, CodeInvalid, "q (the beginning of a key) is required")
		return
	}
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	found, err := d.Inspector.Search(r.Context(), q, min(max(limit, 0), 100))
	if err != nil {
		deskError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": found})
}

// reset signs the operator's reset and has the fleet apply it. A
// credential that may not reset is refused here, and that refusal is
// audited on the key's list as a limiter audits its own; everything else
// (no reason, a bad operation) the limiter judges and audits.
func (d *Desk) reset(w http.ResponseWriter, r *http.Request, op Operator) {
	var b DeskResetBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&b); err != nil || b.Key == "" || b.Scope == "" {
		deskError(w, http.StatusBadRequest, CodeInvalid, "body is not {\"key\",\"scope\",\"op\",\"grant\",\"reason\"} naming a key and a scope")
		return
	}
	if !op.MayReset {
		a := Audit{ID: NewResetID(), Time: d.now().UTC(), Author: op.Identity, Key: b.Key, Scope: b.Scope, Op: b.Op, Grant: b.Grant,
			Reason: b.Reason, Result: "refused", Code: CodeForbidden, By: d.Instance,
			Refusal: op.Identity + "'s credential is read-only: resets need role overrides or policy"}
		rec, _ := json.Marshal(a)
		msg := a.Refusal
		// On the key's audit list in the store its limit names, where
		// inspect reads it and a limiter audits its own refusals.
		if st := d.Inspector.storeOf(r.Context(), b.Key, b.Scope); st == nil {
			msg += " (not audited: the key's store is not configured here: REDIS_ADDRS, REDIS_STORES)"
		} else if err := st.Audit(r.Context(), b.Key, rec); err != nil {
			msg += " (and the refusal could not be audited: " + err.Error() + ")"
		}
		writeError(w, http.StatusForbidden, CodeForbidden, msg, rec) // as a limiter refuses
		return
	}
	if d.Signer == nil {
		deskError(w, http.StatusServiceUnavailable, CodeNoKeyring, "resets are signed: set POLICY_SIGNING_KEY_FILE on the usage API (a key the limiters' POLICY_TRUSTED_KEYS_FILE trusts)")
		return
	}
	sr, err := Sign(d.Signer, ResetRequest{ID: NewResetID(), Key: b.Key, Scope: b.Scope, Op: b.Op, Grant: b.Grant,
		Reason: b.Reason, Author: op.Identity, Time: d.now().UTC()})
	if err != nil {
		deskError(w, http.StatusInternalServerError, CodeInvalid, err.Error())
		return
	}
	status, out, _, err := d.Inspector.SendReset(r.Context(), sr)
	if err != nil {
		deskError(w, http.StatusBadGateway, "limiter_unreachable", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// ResetTimeout bounds the POST of a reset to one limiter.
const ResetTimeout = 10 * time.Second

// SendReset posts sr to the first limiter of the fleet (Limiters, with
// Token) that answers, each within ResetTimeout, and returns its status
// and body and which limiter it was. Another limiter is tried only when
// one cannot be reached: the reset's id makes a resend apply once.
func (in *Inspector) SendReset(ctx context.Context, sr SignedReset) (status int, body []byte, limiter string, err error) {
	if len(in.Limiters) == 0 {
		return 0, nil, "", errors.New("no limiter to apply the reset: LIMITER_FLEET_URLS is empty")
	}
	doc, _ := json.Marshal(sr)
	hc := in.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	var errs []error
	for _, u := range in.Limiters {
		status, body, err := postReset(ctx, hc, u, in.Token, doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u, err))
			continue
		}
		return status, body, u, nil
	}
	return 0, nil, "", fmt.Errorf("no limiter answered: %w", errors.Join(errs...))
}

func postReset(ctx context.Context, hc *http.Client, base, token string, doc []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, ResetTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/admin/keys/reset", bytes.NewReader(doc))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, out, err
}

// deskError is the usage API's error body, {"error":{"code","message"}},
// for what the desk refuses itself; a limiter's answer to a reset is
// passed on as it is.
func deskError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
