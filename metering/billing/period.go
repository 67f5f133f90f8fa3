// Package billing turns the exact usage record into what a finance team
// invoices and defends: statements of a key's usage over a calendar month
// in the customer's time zone, final after a grace for late events;
// corrections (voids, credits, debits) that are themselves events on the
// decisions log; and the arithmetic that carries what arrives after a
// period is final into the next statement as an adjustment. It depends on
// the standard library and package metering only; the ClickHouse reads and
// writes are in billing/chstore, the HTTP routes in billing/billingapi.
//
// The rules, in the words of docs/billing.md:
//
//   - A period is a calendar month in a time zone (UTC by default). Its
//     bounds must fall on whole minutes, the finest bucket of the rollups:
//     every zone in use today does (Asia/Kathmandu is +05:45); a zone whose
//     offset at a bound has seconds (local mean times before 1900) is
//     refused, because the rollups cannot answer it exactly.
//   - A period is open until its end, closing for the grace after it
//     (late events still count in it), final after that. The first
//     statement asked of a final period freezes it: its lines are written
//     once (a snapshot) and every later answer is that snapshot.
//   - What the record gains for a final period afterwards (a late event, a
//     correction that voids part of it) is never added to it: it is shown
//     in the next statement that is not final yet, as an adjustment line
//     naming the period it belongs to.
//   - An account (a customer billed once for several keys) is the sum of
//     its keys' statements.
//   - A void removes what the record held for its range when it was made;
//     an event that arrives later into the range counts.
//   - Every exported row has an identifier, and a row for a billing
//     system is planned (its value fixed) before it is sent: the open
//     month's hourly rows and a final month's remainder then bill every
//     unit once, however often an export stops and resumes.
package billing

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrUnavailable marks a store error that is the store's fault
// (unreachable, timed out): the API answers 503 and the caller may retry.
var ErrUnavailable = errors.New("billing store unavailable")

// ErrInvalid marks a request that cannot be answered as asked (a malformed
// period, an unknown zone, a zone whose month bounds are not whole minutes).
var ErrInvalid = errors.New("invalid billing request")

// States of a period (Statement.State).
const (
	StateOpen    = "open"    // the period has not ended
	StateClosing = "closing" // ended, within the grace: late events still count in it
	StateFinal   = "final"   // the grace is over: the statement is frozen
)

// DefaultGrace is how long after its end a period still takes late events
// unless configured otherwise (BILLING_GRACE).
const DefaultGrace = 72 * time.Hour

// Period is one calendar month in a time zone. The zero value is not a
// period; build one with ParsePeriod or PeriodOf.
type Period struct {
	Year  int
	Month time.Month
	Loc   *time.Location
}

// ParsePeriod reads "YYYY-MM" in the zone named tz ("" = UTC) and checks
// that the month's bounds fall on whole minutes.
func ParsePeriod(s, tz string) (Period, error) {
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil || strings.ContainsAny(tz, " \\") {
			return Period{}, fmt.Errorf("%w: tz %q is not an IANA time zone", ErrInvalid, tz)
		}
		loc = l
	}
	y, m, ok := strings.Cut(s, "-")
	year, err1 := strconv.Atoi(y)
	month, err2 := strconv.Atoi(m)
	if !ok || len(y) != 4 || len(m) != 2 || err1 != nil || err2 != nil || year < 1971 || year > 2105 || month < 1 || month > 12 {
		return Period{}, fmt.Errorf("%w: period %q must be YYYY-MM (a calendar month, 1971-01 to 2105-12)", ErrInvalid, s)
	}
	p := Period{Year: year, Month: time.Month(month), Loc: loc}
	if err := p.check(); err != nil {
		return Period{}, err
	}
	return p, nil
}

// PeriodOf is the period, in loc, that holds t.
func PeriodOf(t time.Time, loc *time.Location) Period {
	l := t.In(loc)
	return Period{Year: l.Year(), Month: l.Month(), Loc: loc}
}

// check refuses a month whose bounds are not whole minutes: the rollups'
// finest bucket is a UTC minute, so only such a month is a sum of buckets.
func (p Period) check() error {
	start, end := p.Bounds()
	for _, b := range []time.Time{start, end} {
		if b.Unix()%60 != 0 {
			_, off := b.Zone()
			return fmt.Errorf("%w: in %s the month %s starts or ends at UTC offset %ds, not a whole minute: the rollups cannot sum it exactly", ErrInvalid, p.Loc, p, off)
		}
	}
	return nil
}

// Bounds are the first instant of the month and the first of the next.
func (p Period) Bounds() (start, end time.Time) {
	start = time.Date(p.Year, p.Month, 1, 0, 0, 0, 0, p.Loc)
	return start, time.Date(p.Year, p.Month+1, 1, 0, 0, 0, 0, p.Loc)
}

// String is "YYYY-MM".
func (p Period) String() string { return fmt.Sprintf("%04d-%02d", p.Year, int(p.Month)) }

// TZ is the zone's name ("UTC" for UTC).
func (p Period) TZ() string { return p.Loc.String() }

// Next is the following month in the same zone.
func (p Period) Next() Period {
	n := time.Date(p.Year, p.Month+1, 1, 0, 0, 0, 0, time.UTC)
	return Period{Year: n.Year(), Month: n.Month(), Loc: p.Loc}
}

// Add is the month n months after p (before it when n < 0).
func (p Period) Add(n int) Period {
	t := time.Date(p.Year, p.Month+time.Month(n), 1, 0, 0, 0, 0, time.UTC)
	return Period{Year: t.Year(), Month: t.Month(), Loc: p.Loc}
}

// Contains reports whether t lies in the period.
func (p Period) Contains(t time.Time) bool {
	start, end := p.Bounds()
	return !t.Before(start) && t.Before(end)
}

// State is the period's state at now with the given grace.
func (p Period) State(now time.Time, grace time.Duration) string {
	_, end := p.Bounds()
	switch {
	case now.Before(end):
		return StateOpen
	case now.Before(end.Add(grace)):
		return StateClosing
	}
	return StateFinal
}
