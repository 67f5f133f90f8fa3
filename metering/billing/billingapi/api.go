// Package billingapi serves billing's operator routes beside the usage
// API (cmd/usage-api routes /v1/admin/statements/ and
// /v1/admin/corrections here):
//
//	GET  /v1/admin/statements/{key}?period=YYYY-MM[&tz=ZONE][&verify=true]
//	GET  /v1/admin/account-statements/{account}?period=YYYY-MM[&tz=ZONE][&verify=true]
//	POST /v1/admin/corrections
//	GET  /v1/admin/corrections?key=KEY
//
// Both need an operator credential (USAGE_ADMIN_TOKEN or a line of
// USAGE_ADMIN_TOKENS_FILE); a correction needs one whose role may write,
// and records its identity. Errors are the usage API's body,
// {"error": {"code", "message"}}.
package billingapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/ratewarden/ratewarden/metering/billing"
)

// Operator is who a request's credential is.
type Operator struct {
	Identity string // recorded as a correction's operator
	CanWrite bool   // may make corrections
}

// Config configures a Handler.
type Config struct {
	Statements *billing.Statements // required
	// Corrections makes corrections; nil = POST /v1/admin/corrections
	// answers 503 (no decisions log configured: KAFKA_BROKERS).
	Corrections *billing.Corrector
	// Accounts are the accounts and their keys (BILLING_ACCOUNTS_FILE);
	// nil = every account statement answers 404.
	Accounts billing.Accounts
	// Authenticate is the operator of a request's bearer token; ok false
	// = 401.
	Authenticate func(r *http.Request) (op Operator, ok bool)
	// Timeout bounds every store call of one request; 0 = 10 s. A verify
	// reads the raw record and gets VerifyTimeout instead.
	Timeout, VerifyTimeout time.Duration
	Logger                 *slog.Logger // nil = discard
}

// Handler serves the routes. Safe for concurrent use.
type Handler struct {
	cfg Config
	mux *http.ServeMux
	log *slog.Logger
}

// New builds a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Statements == nil || cfg.Authenticate == nil {
		return nil, errors.New("billingapi: Config.Statements and Config.Authenticate are required")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.VerifyTimeout == 0 {
		cfg.VerifyTimeout = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), log: cfg.Logger}
	h.mux.HandleFunc("GET /v1/admin/statements/{key}", h.auth(false, h.getStatement))
	h.mux.HandleFunc("GET /v1/admin/account-statements/{account}", h.auth(false, h.getAccountStatement))
	h.mux.HandleFunc("POST /v1/admin/corrections", h.auth(true, h.postCorrection))
	h.mux.HandleFunc("GET /v1/admin/corrections", h.auth(false, h.listCorrections))
	return h, nil
}

// Routes are the path prefixes the Handler serves, for the caller's mux.
func Routes() []string {
	return []string{"/v1/admin/statements/", "/v1/admin/account-statements/", "/v1/admin/corrections"}
}

// Operations lists the routes served ("METHOD /path/{param}"), for the
// OpenAPI document's test.
func Operations() []string {
	return []string{"GET /v1/admin/statements/{key}", "GET /v1/admin/account-statements/{account}", "POST /v1/admin/corrections",
		"GET /v1/admin/corrections"}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) auth(write bool, next func(http.ResponseWriter, *http.Request, Operator)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		op, ok := h.cfg.Authenticate(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="usage"`)
			fail(w, http.StatusUnauthorized, "unauthorized", "this endpoint needs an operator token")
			return
		}
		if write && !op.CanWrite {
			fail(w, http.StatusForbidden, "forbidden", "this credential's role may not make corrections")
			return
		}
		next(w, r, op)
	}
}

// fail writes the usage API's error body.
func fail(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// storeFail maps an error of the billing layer to its status.
func (h *Handler) storeFail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, billing.ErrInvalid):
		fail(w, http.StatusBadRequest, "invalid_request", err.Error())
	case errors.Is(err, billing.ErrConflict):
		fail(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, billing.ErrNotFound):
		fail(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, billing.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		h.log.Warn("billing store unavailable", "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", "5")
		fail(w, http.StatusServiceUnavailable, "store_unavailable", "billing data is temporarily unavailable; retry shortly")
	default:
		h.log.Error("billing error", "path", r.URL.Path, "err", err)
		fail(w, http.StatusInternalServerError, "internal", "internal error")
	}
}

var statementParams = map[string]bool{"period": true, "tz": true, "verify": true}

// statementQuery reads the path's name (a key or an account) and the
// query of a statement; ok false when it has answered 400.
func statementQuery(w http.ResponseWriter, r *http.Request, name string) (id string, p billing.Period, verify, ok bool) {
	q := r.URL.Query()
	for param, vs := range q {
		if !statementParams[param] {
			fail(w, http.StatusBadRequest, "invalid_request", "unknown parameter "+param+" (period, tz, verify)")
			return "", p, false, false
		}
		if len(vs) != 1 {
			fail(w, http.StatusBadRequest, "invalid_request", "parameter "+param+" given more than once")
			return "", p, false, false
		}
	}
	id = r.PathValue(name)
	if id == "" || len(id) > 256 {
		fail(w, http.StatusBadRequest, "invalid_request", name+" must be 1 to 256 bytes")
		return "", p, false, false
	}
	p, err := billing.ParsePeriod(q.Get("period"), q.Get("tz"))
	if err != nil {
		fail(w, http.StatusBadRequest, "invalid_request", err.Error())
		return "", p, false, false
	}
	switch q.Get("verify") {
	case "", "false":
	case "true":
		verify = true
	default:
		fail(w, http.StatusBadRequest, "invalid_request", "verify must be true or false")
		return "", p, false, false
	}
	return id, p, verify, true
}

func (h *Handler) timeout(verify bool) time.Duration {
	if verify {
		return h.cfg.VerifyTimeout
	}
	return h.cfg.Timeout
}

func (h *Handler) getStatement(w http.ResponseWriter, r *http.Request, _ Operator) {
	key, p, verify, ok := statementQuery(w, r, "key")
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout(verify))
	defer cancel()
	st, err := h.cfg.Statements.Get(ctx, key, p, verify)
	if err != nil {
		h.storeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// getAccountStatement answers an account's statement: each of its keys'
// and their sum. An account reads as many statements as it has keys, so
// its deadline grows with them.
func (h *Handler) getAccountStatement(w http.ResponseWriter, r *http.Request, _ Operator) {
	account, p, verify, ok := statementQuery(w, r, "account")
	if !ok {
		return
	}
	n := max(1, len(h.cfg.Accounts[account]))
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(n)*h.timeout(verify))
	defer cancel()
	st, err := h.cfg.Statements.Account(ctx, h.cfg.Accounts, account, p, verify)
	if err != nil {
		h.storeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// correctionAnswer is what a correction changed: the audit record, its
// net effect, and whether this request made it (false: the same id was
// recorded before, and its events were published again).
type correctionAnswer struct {
	billing.Correction
	Net     billing.Totals `json:"net"`
	Created bool           `json:"created"`
}

func (h *Handler) postCorrection(w http.ResponseWriter, r *http.Request, op Operator) {
	if h.cfg.Corrections == nil {
		w.Header().Set("Retry-After", "60")
		fail(w, http.StatusServiceUnavailable, "unavailable", "corrections are events on the decisions log: set KAFKA_BROKERS on usage-api")
		return
	}
	var req billing.Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(w, http.StatusRequestEntityTooLarge, "too_large", "body over 64 KiB")
			return
		}
		fail(w, http.StatusBadRequest, "invalid_request", `body must be JSON {"id","key","scope"?,"from"?,"to"?,"eventId"?,"requests"?,"cost"?,"reason"}: `+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.VerifyTimeout)
	defer cancel()
	c, created, err := h.cfg.Corrections.Apply(ctx, req, op.Identity)
	if err != nil {
		h.storeFail(w, r, err)
		return
	}
	h.log.Info("correction", "id", c.ID, "key", c.Key, "kind", c.Kind, "operator", c.Operator, "created", created, "pieces", len(c.Pieces))
	writeJSON(w, http.StatusOK, correctionAnswer{Correction: c, Net: c.Net(), Created: created})
}

// correctionList is a key's corrections, each with what it changed.
type correctionList struct {
	Key         string             `json:"key"`
	Corrections []listedCorrection `json:"corrections"`
}

type listedCorrection struct {
	billing.Correction
	Net billing.Totals `json:"net"`
}

// listCorrections answers a key's corrections as they were recorded (the
// first of each id), oldest first: the audit records behind the
// statements' correction lines and the usage series they changed.
func (h *Handler) listCorrections(w http.ResponseWriter, r *http.Request, _ Operator) {
	q := r.URL.Query()
	for name, vs := range q {
		if name != "key" || len(vs) != 1 {
			fail(w, http.StatusBadRequest, "invalid_request", "the only parameter is key, once")
			return
		}
	}
	key := q.Get("key")
	if key == "" || len(key) > 256 {
		fail(w, http.StatusBadRequest, "invalid_request", "key must be 1 to 256 bytes")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	cs, err := h.cfg.Statements.Store.Corrections(ctx, key)
	if err != nil {
		h.storeFail(w, r, err)
		return
	}
	slices.SortStableFunc(cs, func(a, b billing.Correction) int { return a.RecordedAt.Compare(b.RecordedAt) })
	out := correctionList{Key: key, Corrections: make([]listedCorrection, 0, len(cs))}
	for _, c := range cs {
		if c.Pieces == nil {
			c.Pieces = []billing.Piece{}
		}
		out.Corrections = append(out.Corrections, listedCorrection{Correction: c, Net: c.Net()})
	}
	writeJSON(w, http.StatusOK, out)
}
