package chsink

import (
	"time"

	"github.com/ratewarden/ratewarden/metering"
)

// Monthly partitions: every INSERT is one block into one month, so a
// batch's rows and its marker rows stay in the month they are counted in.

// MonthOf is the UTC calendar month of a ms timestamp, as year*12+month.
func MonthOf(tsMillis int64) int {
	t := time.UnixMilli(tsMillis).UTC()
	return t.Year()*12 + int(t.Month())
}

// Months are the UTC months (MonthOf) an event's rows go to: Event, its
// time's, for every table but the carry streams; Carry, for a settle whose
// reservation was made in another month (the month before), that month,
// where the carry streams count its difference (0 for any other event).
// Each INSERT must stay in one monthly partition to be atomic, so a batch
// holds the events of one Event month, and those of them that carry, into
// one Carry month (Join).
type Months struct{ Event, Carry int }

// MonthsOf is the Months of e.
func MonthsOf(e *metering.Event) Months {
	m := Months{Event: MonthOf(e.TS)}
	if e.Kind == metering.KindSettle && e.ReservedTS != 0 {
		if c := MonthOf(e.ReservedTS); c != m.Event {
			m.Carry = c
		}
	}
	return m
}

// Join is the Months of a batch holding the events of m and of o; ok is
// false when one batch cannot hold both (another Event month, or another
// Carry month).
func (m Months) Join(o Months) (Months, bool) {
	if m.Event != o.Event || m.Carry != 0 && o.Carry != 0 && m.Carry != o.Carry {
		return m, false
	}
	if m.Carry == 0 {
		m.Carry = o.Carry
	}
	return m, true
}

// markerStart is the start of a batch's marker row: a day start in the
// month of the table's rows (at: the time a row is counted at), so that the
// INSERT stays in one monthly partition.
func markerStart(recs []Record, at func(*metering.Event) int64) time.Time {
	t := time.Now().UTC()
	if len(recs) > 0 {
		t = time.UnixMilli(at(&recs[0].Event)).UTC()
	}
	return t.Truncate(24 * time.Hour)
}

// eventTime is an event's own time, the month of every table's rows but
// the carry streams'.
func eventTime(e *metering.Event) int64 { return e.TS }

// carryStart is the start of a carry stream's marker: a day start in the
// month its events carry into (of the batch's events, when none does).
func carryStart(recs []Record) time.Time {
	for i := range recs {
		if e := &recs[i].Event; carries(e) {
			return time.UnixMilli(costTime(e)).UTC().Truncate(24 * time.Hour)
		}
	}
	return markerStart(recs, eventTime)
}
