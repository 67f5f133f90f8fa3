// Package opsapi is the operator's HTTP API of the policy log (docs/reference.md,
// "HTTP endpoints"), served by usage-api: the revision in force, the
// history, pushes and rollbacks of the document, and overrides. It writes
// through policylog.Client, as the limiter's CLI does, so an answer of 200
// means the record was read back as applied; 409 is a conflict (which
// revision was written meanwhile, by whom), 400 lists every validation
// error. Each bearer token is an operator's identity and role
// (credentials.go): the identity is the author of what it writes, the role
// bounds what it may do (403 beyond it).
package opsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

// Config configures a Handler.
type Config struct {
	// Log is the policy log; nil = not configured: every route answers 503
	// with Unavailable as the reason.
	Log         policylog.Log
	Unavailable string
	// Credentials are the operators' tokens (credentials.go); when nil,
	// AdminToken is the one credential (identity admin, role policy).
	Credentials *Credentials
	AdminToken  string
	// Keys: the keyring the API reads the log with (records not signed
	// by it are refused) and the key it signs what it writes with.
	Keys policylog.Keys
	// Timeout bounds one request's reads and writes of the log (default 30 s).
	Timeout time.Duration
	// Audit reads ClickHouse's policy_audit, newest first (revision > 0:
	// only that revision's records); nil = GET /v1/admin/policy/audit
	// answers 503.
	Audit func(ctx context.Context, revision int64, limit int) (any, error)
	// Preview replays recorded traffic under a candidate (the pushed
	// document with the overrides in force) and returns what it would
	// newly reject (policylog/preview), or why it cannot; it bounds its
	// own cost. PUT /v1/admin/policy carries it as "preview" and goes on
	// without one when it fails; ?dryRun=true answers with it and writes
	// nothing. nil = no preview (a dry run answers 503).
	Preview func(ctx context.Context, candidate *policy.WithOverrides) (any, error)
}

// Handler serves the operator API. Safe for concurrent use: requests are
// served one at a time against one client that has read the log so far
// (each request first reads what was appended since).
type Handler struct {
	cfg Config
	mux *http.ServeMux

	mu      sync.Mutex
	client  *policylog.Client
	ensured bool // the topic exists (Ensure succeeded once)
}

// ensurer is a Log that can create its topic (kafkalog.Log), and check
// that it exists without creating it: a read creates nothing.
type ensurer interface {
	Ensure(ctx context.Context) error
	Exists(ctx context.Context) error
}

// New returns the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Credentials == nil {
		if cfg.AdminToken == "" {
			return nil, errors.New("opsapi: Credentials or AdminToken is required")
		}
		c, err := NewCredentials("", cfg.AdminToken)
		if err != nil {
			return nil, err
		}
		cfg.Credentials = c
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	if cfg.Log != nil {
		h.client = policylog.NewClient(cfg.Log, true)
		cfg.Keys.Use(h.client)
	}
	h.mux.HandleFunc("GET /v1/admin/policy", h.getPolicy)
	h.mux.HandleFunc("PUT /v1/admin/policy", h.putPolicy)
	h.mux.HandleFunc("GET /v1/admin/policy/history", h.getHistory)
	h.mux.HandleFunc("POST /v1/admin/policy/rollback", h.postRollback)
	h.mux.HandleFunc("GET /v1/admin/policy/audit", h.getAudit)
	h.mux.HandleFunc("GET /v1/admin/overrides", h.listOverrides)
	h.mux.HandleFunc("GET /v1/admin/overrides/{key}", h.getOverride)
	h.mux.HandleFunc("PUT /v1/admin/overrides/{key}", h.putOverride)
	h.mux.HandleFunc("DELETE /v1/admin/overrides/{key}", h.deleteOverride)
	return h, nil
}

// Routes lists the routes served ("METHOD /path/{param}"), for the
// OpenAPI document's test.
func Routes() []string {
	return []string{
		"GET /v1/admin/policy", "PUT /v1/admin/policy", "GET /v1/admin/policy/history", "POST /v1/admin/policy/rollback", "GET /v1/admin/policy/audit",
		"GET /v1/admin/overrides", "GET /v1/admin/overrides/{key}", "PUT /v1/admin/overrides/{key}", "DELETE /v1/admin/overrides/{key}",
	}
}

// Owns reports whether path is one of this API's (for the binary's
// router, which sends everything else to the usage API).
func Owns(path string) bool {
	return path == "/v1/admin/policy" || strings.HasPrefix(path, "/v1/admin/policy/") ||
		path == "/v1/admin/overrides" || strings.HasPrefix(path, "/v1/admin/overrides/")
}

// roleFor is the role a request needs: read for every GET, overrides for
// a write of an override, policy for a write of the document.
func roleFor(r *http.Request) string {
	switch {
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		return RoleRead
	case strings.HasPrefix(r.URL.Path, "/v1/admin/overrides/"):
		return RoleOverrides
	}
	return RolePolicy
}

type principalKey struct{}

// principal is who made the request (ServeHTTP put it there).
func principal(r *http.Request) Principal {
	p, _ := r.Context().Value(principalKey{}).(Principal)
	return p
}

// ServeHTTP checks the operator's token and its role, then routes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, _ := bearer.Token(r.Header.Get("Authorization"))
	p, ok, err := h.cfg.Credentials.Lookup(tok)
	if !ok {
		msg := "an operator's bearer token (USAGE_ADMIN_TOKEN, or a line of USAGE_ADMIN_TOKENS_FILE) is required"
		if err != nil {
			msg += "; " + err.Error()
		}
		fail(w, http.StatusUnauthorized, "unauthorized", msg, nil)
		return
	}
	if need := roleFor(r); !p.may(need) {
		fail(w, http.StatusForbidden, "forbidden", fmt.Sprintf("%s has role %s; this needs %s", p.Identity, p.Role, need), nil)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	if r.URL.Path == "/v1/admin/policy/audit" { // ClickHouse, not the log
		h.mux.ServeHTTP(w, r)
		return
	}
	if h.client == nil {
		fail(w, http.StatusServiceUnavailable, "policy_log_unavailable", h.cfg.Unavailable, nil)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// with runs fn on the client after reading the log to its end.
func (h *Handler) with(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, c *policylog.Client)) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.cfg.Log.(ensurer); ok && !h.ensured {
		check := e.Ensure
		if r.Method == http.MethodGet {
			check = e.Exists
		}
		if err := check(ctx); err != nil {
			msg := "cannot reach the policy log: " + err.Error()
			if errors.Is(err, policylog.ErrNoTopic) {
				msg = "the policy log is empty: " + err.Error() + "; the first write creates it"
			}
			fail(w, http.StatusServiceUnavailable, "policy_log_unavailable", msg, nil)
			return
		}
		h.ensured = true
	}
	if err := h.client.Sync(ctx); err != nil {
		fail(w, http.StatusServiceUnavailable, "policy_log_unavailable", "cannot read the policy log: "+err.Error(), nil)
		return
	}
	fn(ctx, h.client)
}

// DryRun is Result.Result of PUT /v1/admin/policy?dryRun=true: the
// preview only, nothing written (Revision is the head).
const DryRun = "dry-run"

// Result is the answer to a write.
type Result struct {
	Revision int64  `json:"revision"`
	Result   string `json:"result"` // applied | dry-run
	SHA256   string `json:"sha256,omitempty"`
	Subject  string `json:"subject,omitempty"`
	// Preview: a push's replay of recorded traffic under the candidate.
	Preview any `json:"preview,omitempty"`
}

type errorBody struct {
	Error struct {
		Code    string   `json:"code"`
		Message string   `json:"message"`
		Errors  []string `json:"errors,omitempty"` // every validation error
		// Revision is the head; TakenBy and TakenMessage say who wrote the
		// revision a conflicting write asked for, and why.
		Revision     int64  `json:"revision,omitempty"`
		TakenBy      string `json:"takenBy,omitempty"`
		TakenMessage string `json:"takenMessage,omitempty"`
	} `json:"error"`
}

func fail(w http.ResponseWriter, status int, code, msg string, errs []string) {
	var b errorBody
	b.Error.Code, b.Error.Message, b.Error.Errors = code, msg, errs
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// answer maps a write's outcome to the response: 200, 409 (conflict),
// 400 (every validation error), 503 (the log could not be reached).
func answer(w http.ResponseWriter, o policylog.Outcome, err error) { answerWith(w, o, err, nil) }

// answerWith is answer with a push's preview in the 200.
func answerWith(w http.ResponseWriter, o policylog.Outcome, err error, preview any) {
	var ref *policylog.Refusal
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, Result{Revision: o.Head, Result: policylog.Applied, SHA256: o.Record.SHA256, Subject: o.Record.Subject(), Preview: preview})
	case errors.As(err, &ref):
		var b errorBody
		b.Error.Code, b.Error.Message, b.Error.Revision = o.Code, o.Reason, o.Head
		status := http.StatusBadRequest
		if o.Code == policylog.CodeConflict {
			status = http.StatusConflict
			b.Error.TakenBy, b.Error.TakenMessage = o.Taken.Author, o.Taken.Message
		} else {
			b.Error.Errors = strings.Split(o.Reason, "\n")
		}
		writeJSON(w, status, b)
	default:
		fail(w, http.StatusServiceUnavailable, "policy_log_unavailable", err.Error(), nil)
	}
}

// decode reads a JSON body of at most max bytes, refusing unknown fields.
func decode(w http.ResponseWriter, r *http.Request, max int64, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, max+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, http.StatusBadRequest, "invalid_request", "body: "+err.Error(), nil)
		return false
	}
	return true
}

func (h *Handler) getPolicy(w http.ResponseWriter, r *http.Request) {
	h.with(w, r, func(_ context.Context, c *policylog.Client) {
		doc, rec := c.State().Document()
		if doc == nil {
			fail(w, http.StatusNotFound, "no_policy", "the policy log holds no document yet", nil)
			return
		}
		body := map[string]any{
			"revision": c.State().Head(), "documentRevision": rec.Revision, "hash": doc.Hash(), "sha256": rec.SHA256,
			"author": rec.Author, "message": rec.Message, "time": rec.Time, "document": rec.Document,
			"overrides": c.State().Overrides(),
		}
		if ro, ok := c.State().Rollout(); ok {
			body["rollout"] = map[string]any{"revision": ro.Record.Revision, "endsAt": ro.Record.Rollout.EndsAt,
				"maxNewlyRejected": ro.Record.Rollout.MaxNewlyRejected, "author": ro.Record.Author, "message": ro.Record.Message}
		}
		writeJSON(w, http.StatusOK, body)
	})
}

type putPolicyBody struct {
	Document       string `json:"document"`
	Message        string `json:"message"`
	Author         string `json:"author"` // ignored: the credential's identity is the author
	ExpectRevision *int64 `json:"expectRevision"`
	// ShadowFor (a Go duration, "15m") and MaxNewlyRejected (a fraction,
	// 0.005 = 0.5%) make the write a rollout: the document enters as the
	// fleet's shadow policy, and the judge promotes or withdraws it when
	// the time is up (docs/policy-log.md, "Rollouts that check themselves").
	ShadowFor        string   `json:"shadowFor"`
	MaxNewlyRejected *float64 `json:"maxNewlyRejected"`
}

func (h *Handler) putPolicy(w http.ResponseWriter, r *http.Request) {
	var b putPolicyBody
	if !decode(w, r, policylog.MaxRecord, &b) {
		return
	}
	if b.Message == "" {
		fail(w, http.StatusBadRequest, "invalid_request", "message is required", nil)
		return
	}
	author := principal(r).Identity // never the body's
	doc, err := policy.Parse([]byte(b.Document))
	if err != nil {
		fail(w, http.StatusBadRequest, policylog.CodeInvalid, "the document is refused", strings.Split(err.Error(), "\n"))
		return
	}
	expect := int64(policylog.NoExpect)
	if b.ExpectRevision != nil {
		expect = *b.ExpectRevision
	}
	var shadowFor time.Duration
	if b.ShadowFor != "" || b.MaxNewlyRejected != nil {
		d, err := time.ParseDuration(b.ShadowFor)
		if err != nil || d <= 0 || d > policylog.MaxShadowFor || b.MaxNewlyRejected == nil || !(*b.MaxNewlyRejected >= 0 && *b.MaxNewlyRejected <= 1) {
			fail(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("a rollout needs shadowFor (a duration above 0, at most %s) and maxNewlyRejected (a fraction from 0 to 1)", policylog.MaxShadowFor), nil)
			return
		}
		shadowFor = d
	}
	dry := r.URL.Query().Get("dryRun") == "true"
	if dry && h.cfg.Preview == nil {
		fail(w, http.StatusServiceUnavailable, "replay_unavailable", "no preview here: usage-api replays recorded traffic from ClickHouse", nil)
		return
	}
	h.with(w, r, func(ctx context.Context, c *policylog.Client) {
		var preview any
		if h.cfg.Preview != nil {
			ov := policy.NewOverrides(0)
			if snap := c.State().Snapshot(nil); snap != nil {
				ov = snap.Overrides()
			}
			p, err := h.cfg.Preview(ctx, policy.NewWithOverrides(doc, ov, nil))
			switch {
			case err != nil && dry:
				fail(w, http.StatusServiceUnavailable, "replay_unavailable", "cannot replay recorded traffic: "+err.Error(), nil)
				return
			case err != nil: // the push goes on: the preview informs, never blocks
				preview = map[string]string{"status": "unavailable", "reason": err.Error()}
			default:
				preview = p
			}
		}
		if dry {
			writeJSON(w, http.StatusOK, Result{Revision: c.State().Head(), Result: DryRun, Preview: preview})
			return
		}
		if shadowFor > 0 {
			o, err := c.StartRollout(ctx, b.Document, shadowFor, *b.MaxNewlyRejected, author, b.Message, expect)
			answerWith(w, o, err, preview)
			return
		}
		o, err := c.Push(ctx, b.Document, author, b.Message, expect)
		answerWith(w, o, err, preview)
	})
}

func (h *Handler) getHistory(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			fail(w, http.StatusBadRequest, "invalid_request", "limit must be an integer from 1 to 10000", nil)
			return
		}
		limit = n
	}
	h.with(w, r, func(_ context.Context, c *policylog.Client) {
		out := c.RecentHistory(limit)
		writeJSON(w, http.StatusOK, map[string]any{"revision": c.State().Head(), "entries": out})
	})
}

type rollbackBody struct {
	Revision int64  `json:"revision"`
	Message  string `json:"message"`
	Author   string `json:"author"` // ignored: the credential's identity is the author
}

func (h *Handler) postRollback(w http.ResponseWriter, r *http.Request) {
	var b rollbackBody
	if !decode(w, r, 64<<10, &b) {
		return
	}
	if b.Revision < 1 || b.Message == "" {
		fail(w, http.StatusBadRequest, "invalid_request", "revision (≥ 1) and message are required", nil)
		return
	}
	h.with(w, r, func(ctx context.Context, c *policylog.Client) {
		if _, ok := c.DocumentAt(b.Revision); !ok {
			fail(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("no document in force at revision %d in the log", b.Revision), nil)
			return
		}
		o, err := c.Rollback(ctx, b.Revision, principal(r).Identity, b.Message)
		answer(w, o, err)
	})
}

// Override is an override as the API shows it (as the CLI prints it).
type Override = policylog.OverrideEntry

func (h *Handler) listOverrides(w http.ResponseWriter, r *http.Request) {
	h.with(w, r, func(_ context.Context, c *policylog.Client) {
		out := []Override{}
		for _, rec := range c.State().OverrideRecords() {
			out = append(out, policylog.OverrideEntryOf(rec))
		}
		writeJSON(w, http.StatusOK, map[string]any{"revision": c.State().Head(), "overrides": out})
	})
}

func (h *Handler) getOverride(w http.ResponseWriter, r *http.Request) {
	key, scope := r.PathValue("key"), r.URL.Query().Get("scope")
	h.with(w, r, func(_ context.Context, c *policylog.Client) {
		rec, ok := c.State().Override(key, scope)
		if !ok {
			fail(w, http.StatusNotFound, "not_found", "no override of this key and scope", nil)
			return
		}
		writeJSON(w, http.StatusOK, policylog.OverrideEntryOf(rec))
	})
}

type putOverrideBody struct {
	policy.Override
	Author         string `json:"author"` // ignored: the credential's identity is the author
	Message        string `json:"message"`
	ExpectRevision *int64 `json:"expectRevision"`
}

func (h *Handler) putOverride(w http.ResponseWriter, r *http.Request) {
	key, scope := r.PathValue("key"), r.URL.Query().Get("scope")
	var b putOverrideBody
	if !decode(w, r, 64<<10, &b) {
		return
	}
	if key == "" || len(key) > 256 || len(scope) > 128 {
		fail(w, http.StatusBadRequest, "invalid_request", "key 1-256 bytes, scope at most 128", nil)
		return
	}
	expect := int64(policylog.NoExpect)
	if b.ExpectRevision != nil {
		expect = *b.ExpectRevision
	}
	h.with(w, r, func(ctx context.Context, c *policylog.Client) {
		o, err := c.SetOverride(ctx, key, scope, b.Override, principal(r).Identity, b.Message, expect)
		answer(w, o, err)
	})
}

func (h *Handler) deleteOverride(w http.ResponseWriter, r *http.Request) {
	key, q := r.PathValue("key"), r.URL.Query()
	reason, author := q.Get("reason"), principal(r).Identity
	if reason == "" {
		fail(w, http.StatusBadRequest, "invalid_request", "reason is required (a query parameter)", nil)
		return
	}
	h.with(w, r, func(ctx context.Context, c *policylog.Client) {
		o, err := c.DeleteOverride(ctx, key, q.Get("scope"), author, reason)
		answer(w, o, err)
	})
}

// getAudit serves policy_audit: every record, applied or refused, kept
// for good (also those compaction removed from the log).
func (h *Handler) getAudit(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Audit == nil {
		fail(w, http.StatusServiceUnavailable, "store_unavailable", "the policy audit is not configured", nil)
		return
	}
	q := r.URL.Query()
	limit, rev := 100, int64(0)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			fail(w, http.StatusBadRequest, "invalid_request", "limit must be an integer from 1 to 10000", nil)
			return
		}
		limit = n
	}
	if v := q.Get("revision"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			fail(w, http.StatusBadRequest, "invalid_request", "revision must be an integer ≥ 1", nil)
			return
		}
		rev = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	rows, err := h.cfg.Audit(ctx, rev, limit)
	if err != nil {
		fail(w, http.StatusServiceUnavailable, "store_unavailable", "cannot read policy_audit: "+err.Error(), nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": rows})
}

// Override is the record of the override in force for key and scope
// (false: none), read after the log is read to its end, within ctx: the
// support page's inspect shows its author and reason. Without a Log it
// is an error.
func (h *Handler) Override(ctx context.Context, key, scope string) (policylog.Record, bool, error) {
	if h.client == nil {
		return policylog.Record{}, false, errors.New(h.cfg.Unavailable)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.client.Sync(ctx); err != nil {
		return policylog.Record{}, false, err
	}
	rec, ok := h.client.State().Override(key, scope)
	return rec, ok, nil
}
