package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/metering"
)

// ErrConflict marks a correction refused because of another: the same id
// with a different request, or an event already voided.
var ErrConflict = errors.New("correction conflicts with another")

// ErrNotFound marks a void of an event the raw record does not hold.
var ErrNotFound = errors.New("not found")

// DefaultScope is the scope of a credit or debit that names none.
const DefaultScope = "correction"

// Limits of a correction request.
const (
	MaxIDLen     = 64
	MaxReasonLen = 2000
	MaxVoidRange = 93 * 24 * time.Hour // a quarter: a longer void is several corrections
)

// Request is a correction as asked (POST /v1/admin/corrections): exactly
// one of EventID (void one event), From and To (void a key's usage over a
// range, one scope's with Scope) or Requests/Cost (a credit when negative,
// a debit when positive, at From or now, in Scope or DefaultScope).
type Request struct {
	ID       string     `json:"id"`
	Key      string     `json:"key"`
	Scope    string     `json:"scope,omitempty"`
	From     *time.Time `json:"from,omitempty"`
	To       *time.Time `json:"to,omitempty"`
	EventID  string     `json:"eventId,omitempty"`
	Requests *int64     `json:"requests,omitempty"`
	Cost     *int64     `json:"cost,omitempty"`
	Reason   string     `json:"reason"`
}

// kind checks r and says which correction it is; the error gathers every
// problem.
func (r Request) kind() (string, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.ID == "" || len(r.ID) > MaxIDLen || strings.Trim(r.ID, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		bad("id must be 1 to %d of [A-Za-z0-9._-]", MaxIDLen)
	}
	if r.Key == "" || len(r.Key) > 256 {
		bad("key must be 1 to 256 bytes")
	}
	if len(r.Scope) > 256 {
		bad("scope must be at most 256 bytes")
	}
	if strings.TrimSpace(r.Reason) == "" || len(r.Reason) > MaxReasonLen {
		bad("reason is required (at most %d bytes): it is the audit record's why", MaxReasonLen)
	}
	amounts := r.Requests != nil || r.Cost != nil
	var kind string
	switch {
	case r.EventID != "" && (amounts || r.From != nil || r.To != nil):
		bad("eventId voids one event: give neither from/to nor requests/cost with it")
	case r.EventID != "":
		kind = KindVoidEvent
	case amounts:
		var n, c int64
		if r.Requests != nil {
			n = *r.Requests
		}
		if r.Cost != nil {
			c = *r.Cost
		}
		switch {
		case n == 0 && c == 0:
			bad("a credit or debit needs requests or cost other than 0")
		case n <= 0 && c <= 0:
			kind = KindCredit
		case n >= 0 && c >= 0:
			kind = KindDebit
		default:
			bad("requests and cost of one credit or debit must have the same sign: make two corrections")
		}
		if r.To != nil {
			bad("a credit or debit takes from (when it applies), not to")
		}
	case r.From != nil && r.To != nil:
		kind = KindVoidRange
		switch {
		case !r.From.Before(*r.To):
			bad("from must be before to")
		case r.To.Sub(*r.From) > MaxVoidRange:
			bad("a void covers at most %s: split it", MaxVoidRange)
		}
		if r.From.Unix()%60 != 0 || r.To.Unix()%60 != 0 || r.From.Nanosecond() != 0 || r.To.Nanosecond() != 0 {
			bad("from and to of a void must be whole minutes, the rollups' finest bucket")
		}
	default:
		bad("say what to correct: eventId, from and to, or requests/cost")
	}
	if err := errors.Join(errs...); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return kind, nil
}

// canonical is the request's identity: the same id asked again must be
// the same request.
func (r Request) canonical() string {
	r.Reason = strings.TrimSpace(r.Reason)
	if r.From != nil {
		f := r.From.UTC()
		r.From = &f
	}
	if r.To != nil {
		t := r.To.UTC()
		r.To = &t
	}
	b, _ := json.Marshal(r)
	return string(b)
}

// RawEvent is what a void of one event needs of it: its key, scope, the
// time the rollups count its cost at (a settle's reservation's), whether
// it is a request and was rejected, and its actual cost.
type RawEvent struct {
	Key, Scope      string
	CostTS          int64 // ms
	Request, Reject bool
	ActualCost      int64
}

// CorrectionStore is what the Corrector reads and records.
type CorrectionStore interface {
	// Correction is the correction recorded under id (the first, if two
	// raced); ok false when none is.
	Correction(ctx context.Context, id string) (Correction, bool, error)
	WriteCorrection(ctx context.Context, c Correction) error
	Corrections(ctx context.Context, key string) ([]Correction, error)
	// Minutes are key's usage per scope and minute over [from, to), net
	// of earlier corrections, as pieces (the rollups' usage_minute).
	Minutes(ctx context.Context, key, scope string, from, to time.Time) ([]Piece, error)
	// Event is the raw record's event of id; ok false when it holds none.
	Event(ctx context.Context, key, id string) (RawEvent, bool, error)
}

// Publisher writes events to the decisions log, returning once the log
// has them.
type Publisher interface {
	Publish(ctx context.Context, evs []metering.Event) error
}

// Corrector makes corrections. Safe for concurrent use.
type Corrector struct {
	Store CorrectionStore
	Log   Publisher
	Now   func() time.Time // nil = time.Now
}

// Apply records and publishes the correction req by operator, or, if its
// id was recorded already with the same request, publishes that one's
// events again (the consumer counts them once) and returns it with
// created false. The events are published after the audit record is
// written, so a correction whose publication failed is completed by asking
// it again.
func (c *Corrector) Apply(ctx context.Context, req Request, operator string) (Correction, bool, error) {
	kind, err := req.kind()
	if err != nil {
		return Correction{}, false, err
	}
	canon := req.canonical()
	if prev, ok, err := c.Store.Correction(ctx, req.ID); err != nil {
		return Correction{}, false, err
	} else if ok {
		if prev.Request != canon {
			return Correction{}, false, fmt.Errorf("%w: id %s was recorded with another request (%s)", ErrConflict, req.ID, prev.Request)
		}
		return prev, false, c.Log.Publish(ctx, Events(prev))
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	corr := Correction{ID: req.ID, Key: req.Key, Kind: kind, Scope: req.Scope, EventID: req.EventID,
		Reason: strings.TrimSpace(req.Reason), Operator: operator, RecordedAt: now, Request: canon}
	if corr.Pieces, err = c.pieces(ctx, req, kind, now); err != nil {
		return Correction{}, false, err
	}
	if req.From != nil && kind == KindVoidRange {
		corr.From, corr.To = req.From.UTC(), req.To.UTC()
	}
	if err := c.Store.WriteCorrection(ctx, corr); err != nil {
		return Correction{}, false, err
	}
	// Two requests with one id may race: the first recorded wins, and
	// both publish its events.
	won, ok, err := c.Store.Correction(ctx, req.ID)
	if err != nil {
		return Correction{}, false, err
	}
	if !ok {
		return Correction{}, false, fmt.Errorf("billing: correction %s written is not read back", req.ID)
	}
	if won.Request != canon {
		return Correction{}, false, fmt.Errorf("%w: id %s was recorded with another request (%s)", ErrConflict, req.ID, won.Request)
	}
	return won, won.RecordedAt.UnixMilli() == corr.RecordedAt.UnixMilli() && won.Operator == operator, c.Log.Publish(ctx, Events(won))
}

// pieces are what req changes: for a void, the negation of the usage it
// names as the record holds it now; for a credit or debit, one piece.
func (c *Corrector) pieces(ctx context.Context, req Request, kind string, now time.Time) ([]Piece, error) {
	switch kind {
	case KindVoidRange:
		ms, err := c.Store.Minutes(ctx, req.Key, req.Scope, *req.From, *req.To)
		if err != nil {
			return nil, err
		}
		out := make([]Piece, 0, len(ms))
		for _, m := range ms {
			if m.Requests != 0 || m.Rejected != 0 || m.Cost != 0 {
				out = append(out, Piece{TS: m.TS, Scope: m.Scope, Requests: -m.Requests, Rejected: -m.Rejected, Cost: -m.Cost})
			}
		}
		return out, nil
	case KindVoidEvent:
		prev, err := c.Store.Corrections(ctx, req.Key)
		if err != nil {
			return nil, err
		}
		for _, p := range prev {
			if p.Kind == KindVoidEvent && p.EventID == req.EventID {
				return nil, fmt.Errorf("%w: event %s was voided by correction %s", ErrConflict, req.EventID, p.ID)
			}
		}
		ev, ok, err := c.Store.Event(ctx, req.Key, req.EventID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: key %s has no event %s in the raw record", ErrNotFound, req.Key, req.EventID)
		}
		p := Piece{TS: ev.CostTS, Scope: ev.Scope, Cost: -ev.ActualCost}
		if ev.Request {
			p.Requests = -1
			if ev.Reject {
				p.Rejected = -1
			}
		}
		return []Piece{p}, nil
	}
	p := Piece{TS: now.UnixMilli(), Scope: req.Scope}
	if req.From != nil {
		p.TS = req.From.UnixMilli()
	}
	if p.Scope == "" {
		p.Scope = DefaultScope
	}
	if req.Requests != nil {
		p.Requests = *req.Requests
	}
	if req.Cost != nil {
		p.Cost = *req.Cost
	}
	return []Piece{p}, nil
}

// Events are the events of c's pieces, the same every time they are made:
// ids from the correction's id and the piece's place, times from the
// pieces, so that the consumer's deduplication counts a correction
// published twice once.
func Events(c Correction) []metering.Event {
	out := make([]metering.Event, len(c.Pieces))
	for i, p := range c.Pieces {
		e := metering.Event{EventID: fmt.Sprintf("correction:%s:%d", c.ID, i), TS: p.TS, Key: c.Key, Scope: p.Scope,
			Tier: CorrectionTierPrefix + c.ID, Allowed: true, Source: "correction", Policy: c.Kind, Instance: c.Operator,
			Kind: metering.KindCorrection, Requests: p.Requests, Rejected: p.Rejected}
		if p.Cost < 0 {
			e.Estimate = uint64(-p.Cost)
		} else {
			e.Actual = uint64(p.Cost)
		}
		out[i] = e
	}
	return out
}
