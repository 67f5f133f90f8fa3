package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/jsonstr"
)

// Checker decides; *enforcement.Limiter is one.
type Checker interface {
	Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error)
}

// CheckHandler serves POST /check. It is safe for concurrent use.
type CheckHandler struct {
	checker Checker
	auth    bearer.Checker // zero: no token required
	open    bool
	log     *slog.Logger
	headers ratelimitheader.Mode
}

// SetHeaderMode selects the fields of each answer's "headers" object
// (default Both; None leaves the object out). Call it before serving.
func (h *CheckHandler) SetHeaderMode(m ratelimitheader.Mode) { h.headers = m }

// NewCheckHandler returns the /check handler. With a non-empty authToken,
// requests must carry "Authorization: Bearer <authToken>".
func NewCheckHandler(c Checker, authToken string, log *slog.Logger) *CheckHandler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &CheckHandler{checker: c, auth: bearer.NewChecker(authToken), open: authToken == "", log: log}
}

var jsonContentType = []string{"application/json"}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func (h *CheckHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		WriteError(w, &Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Message: "use POST"}, "")
		return
	}
	if !h.open && !h.auth.Allows(r.Header.Get("Authorization")) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limiter"`)
		WriteError(w, &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "a valid bearer token is required"}, "")
		return
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	body, apiErr := readBody(r, (*bp)[:0])
	*bp = body[:0]
	if apiErr != nil {
		WriteError(w, apiErr, "")
		return
	}
	req, apiErr := DecodeCheck(body)
	if apiErr != nil {
		WriteError(w, apiErr, "")
		return
	}
	d, err := h.checker.Check(r.Context(), req)
	if err != nil && r.Context().Err() != nil {
		return // the client went away: nobody to answer
	}
	if err != nil {
		WriteError(w, errorFor(err), "")
		return
	}
	out := appendDecision((*bp)[:0], &d, h.headers)
	*bp = out[:0]
	// A shared, never-mutated value: no allocation per response. net/http
	// sets Content-Length itself for a body this small.
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(out)
}

// readBody reads at most MaxBodyBytes into buf.
func readBody(r *http.Request, buf []byte) ([]byte, *Error) {
	if r.ContentLength > MaxBodyBytes {
		return buf, tooLarge
	}
	lr := io.LimitReader(r.Body, MaxBodyBytes+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > MaxBodyBytes {
			return buf, tooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, invalid("reading body: %v", err)
		}
	}
}

var tooLarge = &Error{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large", Message: "body is larger than 64 KiB"}

func errorFor(err error) *Error {
	var apiErr *Error
	switch {
	case errors.As(err, &apiErr):
		return apiErr
	case errors.Is(err, enforcement.ErrCostExceedsLimit):
		return &Error{Status: http.StatusBadRequest, Code: "cost_exceeds_limit", Message: err.Error()}
	case errors.Is(err, enforcement.ErrPeekUnavailable):
		return &Error{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Message: err.Error()}
	case errors.Is(err, enforcement.ErrPeekUnsupported):
		return &Error{Status: http.StatusNotImplemented, Code: "peek_unsupported", Message: err.Error()}
	case errors.Is(err, enforcement.ErrConcurrencyOnly):
		return &Error{Status: http.StatusNotImplemented, Code: "not_supported", Message: err.Error()}
	case errors.Is(err, enforcement.ErrUnknownTier), errors.Is(err, enforcement.ErrInvalidRequest), errors.Is(err, slots.ErrUnknownPriority):
		return &Error{Status: http.StatusBadRequest, Code: "invalid_request", Message: err.Error()}
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal", Message: err.Error()}
}

// WriteError writes the contract's error body. requestID is included when set.
func WriteError(w http.ResponseWriter, e *Error, requestID string) {
	b := make([]byte, 0, 128)
	b = append(b, '{')
	b = appendErrorMember(b, e, requestID)
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

// appendErrorMember appends the contract's "error" member.
func appendErrorMember(b []byte, e *Error, requestID string) []byte {
	b = append(b, `"error":{"code":`...)
	b = strconv.AppendQuote(b, e.Code)
	b = append(b, `,"message":`...)
	b = jsonstr.Append(b, e.Message)
	if requestID != "" {
		b = append(b, `,"requestId":`...)
		b = jsonstr.Append(b, requestID)
	}
	return append(b, '}')
}

// appendDecision writes the /check response body without reflection: it is
// on the hot path of every decision.
func appendDecision(b []byte, d *enforcement.Decision, mode ratelimitheader.Mode) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, `,"resetAt":"`...)
	b = ceilSecond(d.ResetAt).AppendFormat(b, time.RFC3339)
	b = append(b, `","retryAfterMs":`...)
	b = strconv.AppendInt(b, d.RetryAfter.Milliseconds(), 10)
	b = append(b, `,"source":"`...)
	b = append(b, d.Source.String()...)
	b = append(b, `","policy":`...)
	b = jsonstr.Append(b, d.Policy)
	b = append(b, `,"tier":`...)
	b = jsonstr.Append(b, d.Tier)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, d.Cost, 10)
	b = append(b, `,"dryRun":`...)
	b = strconv.AppendBool(b, d.DryRun)
	b = append(b, `,"wouldAllow":`...)
	b = strconv.AppendBool(b, d.WouldAllow)
	b = append(b, `,"warning":`...)
	b = strconv.AppendBool(b, d.Warning)
	if d.Shadow.Name != "" {
		// Present only when a shadow limit was evaluated: responses of a
		// policy without shadow limits are unchanged, byte for byte.
		b = append(b, `,"shadow":{"name":`...)
		b = jsonstr.Append(b, d.Shadow.Name)
		b = append(b, `,"wouldAllow":`...)
		b = strconv.AppendBool(b, d.Shadow.WouldAllow)
		b = append(b, '}')
	}
	if d.Reservation != "" {
		b = append(b, `,"reservation":"`...)
		b = append(b, d.Reservation...) // base64url: nothing to escape
		b = append(b, '"')
	}
	if d.Lease != "" {
		b = append(b, `,"lease":"`...)
		b = append(b, d.Lease...) // base64url: nothing to escape
		b = append(b, `","leaseExpiresAt":"`...)
		b = d.LeaseExpiresAt.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if d.Reason != "" {
		b = append(b, `,"reason":`...)
		b = jsonstr.Append(b, d.Reason)
	}
	if mode != ratelimitheader.None {
		b = appendHeaders(b, d, time.Now(), mode)
	}
	return append(b, "}\n"...)
}

// appendHeaders writes the "headers" member: the response header fields
// the middleware would set for d, ready for a caller to copy onto its own
// response.
func appendHeaders(b []byte, d *enforcement.Decision, now time.Time, mode ratelimitheader.Mode) []byte {
	b = append(b, `,"headers":{`...)
	n := len(b)
	if mode.LegacyFields() {
		b = append(b, `"`+ratelimitheader.LimitField+`":"`...)
		b = strconv.AppendInt(b, d.Limit, 10)
		b = append(b, `","`+ratelimitheader.RemainingField+`":"`...)
		b = strconv.AppendInt(b, max(0, d.Remaining), 10)
		b = append(b, `","`+ratelimitheader.ResetField+`":"`...)
		b = strconv.AppendInt(b, ratelimitheader.ResetSeconds(d, now), 10)
		b = append(b, '"')
	}
	if mode.DraftFields() && ratelimitheader.HasPolicy(d) {
		var buf [192]byte // a field value, JSON-escaped below; grows on the heap only past it
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, `"`+ratelimitheader.PolicyField+`":`...)
		b = jsonstr.Append(b, ratelimitheader.AppendPolicy(buf[:0], d, now))
		b = append(b, `,"`+ratelimitheader.RateLimitField+`":`...)
		b = jsonstr.Append(b, ratelimitheader.AppendRateLimit(buf[:0], d, now))
	}
	if !d.Allowed {
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, `"`+ratelimitheader.RetryAfter+`":"`...)
		b = strconv.AppendInt(b, ratelimitheader.RetryAfterSeconds(d), 10)
		b = append(b, '"')
	}
	if d.Warning {
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, `"`+WarningHeader+`":"`+SoftLimitWarning+`"`...)
	}
	return append(b, '}')
}

// ceilSecond rounds t up to a whole second in UTC: a reset time is never
// reported earlier than it is.
func ceilSecond(t time.Time) time.Time {
	t = t.UTC()
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}
