package billing

import "time"

// Correction kinds (Correction.Kind).
const (
	KindVoidEvent = "void_event" // one event voided by its id
	KindVoidRange = "void_range" // a key's (or a key's scope's) usage over a time range voided
	KindCredit    = "credit"     // requests and cost removed (negative amounts)
	KindDebit     = "debit"      // requests and cost added
)

// Piece is one event of a correction: its change of one scope's usage in
// one minute bucket (TS, ms since the epoch, the bucket's start for a
// void; the correction's time for a credit or debit). Requests and
// Rejected are signed changes of the key's requests and rejected
// requests; Cost the signed change of its cost units.
type Piece struct {
	TS       int64  `json:"ts"`
	Scope    string `json:"scope"`
	Requests int64  `json:"requests"`
	Rejected int64  `json:"rejected"`
	Cost     int64  `json:"cost"`
}

// Correction is the audit record of one correction: what was asked, by
// whom, when, and the pieces it became (the events published on the
// decisions log, which the consumer counts like any other).
type Correction struct {
	ID         string    `json:"id"`
	Key        string    `json:"key"`
	Kind       string    `json:"kind"`
	Scope      string    `json:"scope,omitempty"`
	From       time.Time `json:"from,omitzero"`
	To         time.Time `json:"to,omitzero"`
	EventID    string    `json:"eventId,omitempty"`
	Reason     string    `json:"reason"`
	Operator   string    `json:"operator"`
	RecordedAt time.Time `json:"recordedAt"`
	Pieces     []Piece   `json:"pieces"`
	// Request is the request as received (canonical JSON): the same id
	// asked again with another request is refused.
	Request string `json:"-"`
}

// Net is the correction's total change of requests and cost.
func (c Correction) Net() Totals {
	var t Totals
	for _, p := range c.Pieces {
		t.add(p.Requests, p.Cost)
	}
	return t
}
