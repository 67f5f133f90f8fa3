package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/ratewarden/ratewarden/enforcement/slots"
)

// Leaser gives slots back and extends their leases; *slots.Gate is one.
type Leaser interface {
	Release(ctx context.Context, id string) (freed bool, err error)
	Renew(ctx context.Context, id string) (expiresAt time.Time, err error)
	// TTL is a lease's time without a renewal.
	TTL() time.Duration
}

// LeaseHandler serves POST /release and POST /renew, with the same bearer
// token as /check. It is safe for concurrent use.
type LeaseHandler struct {
	leaser Leaser
	admit  *SettleHandler // method, token and body, as /settle's
}

// NewLeaseHandler returns the /release and /renew handlers' owner. With a
// non-empty authToken, requests must carry "Authorization: Bearer
// <authToken>", as for /check.
func NewLeaseHandler(l Leaser, authToken string, log *slog.Logger) *LeaseHandler {
	return &LeaseHandler{leaser: l, admit: NewSettleHandler(nil, authToken, log)}
}

// Release is the POST /release handler: {"lease": id}. 200 with
// "released": true when the lease held a slot, now free; 200 with
// "released": false when it did not (released before, or ended), and then
// nothing changed; 400 invalid_request for a body or id that is not one.
func (h *LeaseHandler) Release() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := h.lease(w, r)
		if !ok {
			return
		}
		freed, err := h.leaser.Release(r.Context(), id)
		if err != nil && r.Context().Err() != nil {
			return
		}
		if err != nil {
			WriteError(w, leaseErrorFor(err), "")
			return
		}
		b := append(make([]byte, 0, 24), `{"released":`...)
		b = strconv.AppendBool(b, freed)
		writeLeaseBody(w, append(b, "}\n"...))
	})
}

// Renew is the POST /renew handler: {"lease": id}. 200 with the new
// "leaseExpiresAt"; 404 lease_not_found when the lease holds no slot any
// more (released, or ended: the work should stop, or take a new slot); 400
// invalid_request; 503 unavailable when the store cannot be asked.
func (h *LeaseHandler) Renew() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := h.lease(w, r)
		if !ok {
			return
		}
		end, err := h.leaser.Renew(r.Context(), id)
		if err != nil && r.Context().Err() != nil {
			return
		}
		if err != nil {
			WriteError(w, leaseErrorFor(err), "")
			return
		}
		b := append(make([]byte, 0, 64), `{"renewed":true,"leaseExpiresAt":"`...)
		b = end.UTC().AppendFormat(b, time.RFC3339Nano)
		writeLeaseBody(w, append(b, "\"}\n"...))
	})
}

func (h *LeaseHandler) lease(w http.ResponseWriter, r *http.Request) (string, bool) {
	body, ok := h.admit.admit(w, r)
	if !ok {
		return "", false
	}
	id, apiErr := DecodeLease(body)
	release(body)
	if apiErr != nil {
		WriteError(w, apiErr, "")
		return "", false
	}
	return id, true
}

func writeLeaseBody(w http.ResponseWriter, b []byte) {
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(b)
}

// DecodeLease parses a /release or /renew body: {"lease": id}, the id a
// non-empty string of at most slots.MaxLeaseIDBytes.
func DecodeLease(body []byte) (string, *Error) {
	var b struct {
		Lease *string `json:"lease"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field == "lease" {
			return "", invalid("lease must be a string")
		}
		return "", invalid("body is not a JSON object: %v", err)
	}
	switch {
	case b.Lease == nil || *b.Lease == "":
		return "", invalid("lease is required")
	case len(*b.Lease) > slots.MaxLeaseIDBytes:
		return "", invalid("lease is %d bytes, at most %d allowed", len(*b.Lease), slots.MaxLeaseIDBytes)
	}
	return *b.Lease, nil
}

func leaseErrorFor(err error) *Error {
	switch {
	case errors.Is(err, slots.ErrInvalidLease):
		return invalid("lease is not a lease id")
	case errors.Is(err, slots.ErrLeaseNotFound):
		return &Error{Status: http.StatusNotFound, Code: "lease_not_found", Message: "the lease holds no slot: released, or ended (another request may hold the slot now)"}
	}
	return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the slot store could not be asked: " + err.Error()}
}
