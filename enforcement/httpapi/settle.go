package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/jsonstr"
)

// Settler charges costs known after the work; *enforcement.Limiter is one.
type Settler interface {
	Settle(ctx context.Context, id string, cost int64) (enforcement.Settlement, error)
	Charge(ctx context.Context, req enforcement.Request) (enforcement.Settlement, error)
}

// MaxReservationBytes bounds a reservation id in a /settle body.
const MaxReservationBytes = 4096

// SettleHandler serves POST /settle and POST /charge (Settle and Charge),
// with the same bearer token as /check. It is safe for concurrent use.
type SettleHandler struct {
	settler Settler
	auth    bearer.Checker
	open    bool
	log     *slog.Logger
}

// NewSettleHandler returns the /settle and /charge handlers' owner. With a
// non-empty authToken, requests must carry "Authorization: Bearer
// <authToken>", as for /check.
func NewSettleHandler(s Settler, authToken string, log *slog.Logger) *SettleHandler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &SettleHandler{settler: s, auth: bearer.NewChecker(authToken), open: authToken == "", log: log}
}

// Settle is the POST /settle handler: {"reservation": id, "cost": N}.
// 200 settled; 202 queued (the store could not be asked: it will be
// applied once, when it answers); 404 reservation_not_found; 409
// already_settled; 400 invalid_request.
func (h *SettleHandler) Settle() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := h.admit(w, r)
		if !ok {
			return
		}
		id, cost, apiErr := DecodeSettle(body)
		release(body)
		if apiErr != nil {
			WriteError(w, apiErr, "")
			return
		}
		s, err := h.settler.Settle(r.Context(), id, cost)
		if err != nil && r.Context().Err() != nil {
			return
		}
		if err != nil {
			WriteError(w, settleErrorFor(err), "")
			return
		}
		status := http.StatusOK
		if s.Queued {
			status = http.StatusAccepted
		}
		writeSettlement(w, status, &s)
	})
}

// Charge is the POST /charge handler: {"key", "scope", "cost", "tier"?}.
// Always 200 for a valid request, debt allowed ("queued": true when the
// store could not be asked); 400 invalid_request otherwise.
func (h *SettleHandler) Charge() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := h.admit(w, r)
		if !ok {
			return
		}
		req, apiErr := DecodeCharge(body)
		release(body)
		if apiErr != nil {
			WriteError(w, apiErr, "")
			return
		}
		s, err := h.settler.Charge(r.Context(), req)
		if err != nil && r.Context().Err() != nil {
			return
		}
		if err != nil {
			WriteError(w, settleErrorFor(err), "")
			return
		}
		writeSettlement(w, http.StatusOK, &s)
	})
}

// admit checks the method and the token and reads the body.
func (h *SettleHandler) admit(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		WriteError(w, &Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Message: "use POST"}, "")
		return nil, false
	}
	if !h.open && !h.auth.Allows(r.Header.Get("Authorization")) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limiter"`)
		WriteError(w, &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "a valid bearer token is required"}, "")
		return nil, false
	}
	bp := bufPool.Get().(*[]byte)
	body, apiErr := readBody(r, (*bp)[:0])
	if apiErr != nil {
		*bp = body[:0]
		bufPool.Put(bp)
		WriteError(w, apiErr, "")
		return nil, false
	}
	return body, true
}

// release gives a body admit read back to the pool, once nothing refers
// to it (the decoded id is a copy).
func release(body []byte) {
	b := body[:0]
	bufPool.Put(&b)
}

// DecodeSettle parses a /settle body: the reservation id (a non-empty
// string of at most MaxReservationBytes) and the actual cost (an integer
// in [0, 1e9]), both required.
func DecodeSettle(body []byte) (id string, cost int64, apiErr *Error) {
	if raw, rawCost, ok := scanSettle(body); ok { // the common body, without reflection
		switch {
		case len(raw) == 0:
			return "", 0, invalid("reservation is required")
		case len(raw) > MaxReservationBytes:
			return "", 0, invalid("reservation is %d bytes, at most %d allowed", len(raw), MaxReservationBytes)
		}
		cost, apiErr = parseCost(rawCost)
		return string(raw), cost, apiErr
	}
	return decodeSettleJSON(body)
}

// decodeSettleJSON is DecodeSettle's general decoder: any valid JSON, with
// encoding/json's rules.
func decodeSettleJSON(body []byte) (id string, cost int64, apiErr *Error) {
	var b struct {
		Reservation *string         `json:"reservation"`
		Cost        json.RawMessage `json:"cost"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field == "reservation" {
			return "", 0, invalid("reservation must be a string")
		}
		return "", 0, invalid("body is not a JSON object: %v", err)
	}
	switch {
	case b.Reservation == nil || *b.Reservation == "":
		return "", 0, invalid("reservation is required")
	case len(*b.Reservation) > MaxReservationBytes:
		return "", 0, invalid("reservation is %d bytes, at most %d allowed", len(*b.Reservation), MaxReservationBytes)
	case len(b.Cost) == 0 || string(b.Cost) == "null":
		return "", 0, invalid("cost is required: the actual cost")
	}
	cost, apiErr = parseCost(b.Cost)
	return *b.Reservation, cost, apiErr
}

// DecodeCharge parses a /charge body: /check's key, scope and tier, and a
// cost, which is required.
func DecodeCharge(body []byte) (enforcement.Request, *Error) {
	req, apiErr := DecodeCheck(body)
	if apiErr != nil {
		return req, apiErr
	}
	if !req.HasCost {
		return enforcement.Request{}, invalid("cost is required: the cost to charge")
	}
	if req.Reserve {
		return enforcement.Request{}, invalid("reserve is not valid on /charge")
	}
	return req, nil
}

func settleErrorFor(err error) *Error {
	switch {
	case errors.Is(err, enforcement.ErrReservationNotFound):
		return &Error{Status: http.StatusNotFound, Code: "reservation_not_found", Message: "no such reservation: never made, or expired (its estimate stands)"}
	case errors.Is(err, enforcement.ErrAlreadySettled):
		return &Error{Status: http.StatusConflict, Code: "already_settled", Message: "the reservation was settled before; nothing was charged"}
	case errors.Is(err, enforcement.ErrReserveUnsupported):
		return &Error{Status: http.StatusNotImplemented, Code: "not_supported", Message: err.Error()}
	case errors.Is(err, enforcement.ErrSettleQueueFull):
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: err.Error()}
	}
	return errorFor(err)
}

// writeSettlement writes a settle's or a charge's answer.
func writeSettlement(w http.ResponseWriter, status int, s *enforcement.Settlement) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	b := (*bp)[:0]
	b = append(b, '{')
	if s.Kind == enforcement.KindSettle {
		b = append(b, `"settled":`...)
		b = strconv.AppendBool(b, !s.Queued)
		b = append(b, ',')
	}
	b = append(b, `"charged":`...)
	b = strconv.AppendInt(b, s.Charged, 10)
	if s.Queued {
		b = append(b, `,"queued":true`...)
	} else {
		if s.Kind == enforcement.KindSettle {
			b = append(b, `,"estimate":`...)
			b = strconv.AppendInt(b, s.Estimate, 10)
			b = append(b, `,"refunded":`...)
			b = strconv.AppendInt(b, s.Refunded, 10)
		}
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, s.Remaining, 10)
		b = append(b, `,"debt":`...)
		b = strconv.AppendInt(b, s.Debt, 10)
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, s.Limit, 10)
		b = append(b, `,"resetAt":"`...)
		b = ceilSecond(s.ResetAt).AppendFormat(b, time.RFC3339)
		b = append(b, `","retryAfterMs":`...)
		b = strconv.AppendInt(b, s.RetryAfter.Milliseconds(), 10)
		b = append(b, `,"warning":`...)
		b = strconv.AppendBool(b, s.Warning)
	}
	b = append(b, `,"policy":`...)
	b = jsonstr.Append(b, s.Policy)
	b = append(b, `,"tier":`...)
	b = jsonstr.Append(b, s.Tier)
	b = append(b, "}\n"...)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(b)
	*bp = b[:0]
}
