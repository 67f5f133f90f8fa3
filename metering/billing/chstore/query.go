package chstore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/schema"
)

// usageQuery sums one rollup table of one key over [from, to) by scope and
// tier (a correction's rows have a tier of their own).
type usageQuery struct {
	db, table, key string
	from, to       time.Time // bucket-aligned for table
}

// planUsage splits [from, to) (whole minutes) into the whole UTC hours
// inside it, read from usage_hour, and the minutes at its edges, read from
// usage_minute: the fewest rows that sum it exactly.
func planUsage(db, key string, from, to time.Time) []usageQuery {
	hs, he := from.Truncate(time.Hour), to.Truncate(time.Hour)
	if hs.Before(from) {
		hs = hs.Add(time.Hour)
	}
	if !hs.Before(he) {
		return []usageQuery{{db: db, table: schema.UsageMinute, key: key, from: from, to: to}}
	}
	var qs []usageQuery
	if from.Before(hs) {
		qs = append(qs, usageQuery{db: db, table: schema.UsageMinute, key: key, from: from, to: hs})
	}
	qs = append(qs, usageQuery{db: db, table: schema.UsageHour, key: key, from: hs, to: he})
	if he.Before(to) {
		qs = append(qs, usageQuery{db: db, table: schema.UsageMinute, key: key, from: he, to: to})
	}
	return qs
}

// toSQL: the rollups are ordered by (key, scope, tier, start): key first
// lets the primary index skip every other customer's rows. Read with sum()
// (rows collapse only on merge); key = ” markers are never read.
func (q usageQuery) toSQL() (string, []any) {
	return fmt.Sprintf("SELECT scope, tier, sum(requests) AS n_req, sum(cost) AS n_cost FROM %s.%s"+
			" WHERE key = ? AND start >= toDateTime(?) AND start < toDateTime(?) GROUP BY scope, tier ORDER BY scope, tier"+inOrder, q.db, q.table),
		[]any{q.key, q.from.Unix(), q.to.Unix()}
}

// rawQuery sums decisions_raw for one key over [from, to) by scope, as the
// rollups count: a decision at its ts, a settle's actual − estimate at its
// reservation's time (reserved_ts), a charge at its ts. The table is
// ordered by Kafka position, so this reads the months of the range (the
// monthly partitions of event_time) whole: the slow, independent check.
// A settle is written after its reservation, so no row of the range lies
// before from; settles of the range may lie after to.
type rawQuery struct {
	db, key  string
	from, to time.Time
}

func (q rawQuery) toSQL() (string, []any) {
	const at = "if(kind = 'settle' AND reserved_ts != 0, reserved_ts, ts)"
	return fmt.Sprintf("SELECT scope, toInt64(countIf(kind = 'decision')) AS n_req, sum(actual_cost) AS n_cost FROM %s.%s"+
			" WHERE key = ? AND event_time >= toDateTime(?) AND (event_time < toDateTime(?) OR kind = 'settle') AND kind != 'correction'"+
			" AND "+at+" >= ? AND "+at+" < ? GROUP BY scope ORDER BY scope"+inOrder, q.db, schema.DecisionsRaw),
		[]any{q.key, q.from.Unix(), q.to.Unix(), uint64(q.from.UnixMilli()), uint64(q.to.UnixMilli())}
}

// snapshotsQuery reads every frozen statement of one key in one zone,
// each period's first written snapshot first (ORDER BY of the table).
type snapshotsQuery struct{ db, key, tz string }

func (q snapshotsQuery) toSQL() (string, []any) {
	return fmt.Sprintf("SELECT period, snapshot, finalized_ms, line, scope, unit, ref, requests, cost FROM %s.%s"+
			" WHERE key = ? AND tz = ? ORDER BY period, finalized_ms, snapshot"+inOrder, q.db, schema.BillingStatements),
		[]any{q.key, q.tz}
}

// correctionsQuery reads the corrections of one key, or the one of an id,
// each id's first record first.
type correctionsQuery struct{ db, key, id string }

func (q correctionsQuery) toSQL() (string, []any) {
	where, arg := "key = ?", q.key
	if q.id != "" {
		where, arg = "id = ?", q.id
	}
	return fmt.Sprintf("SELECT id, key, kind, scope, from_ms, to_ms, event_id, reason, operator, request, pieces, recorded_ms FROM %s.%s"+
			" WHERE %s ORDER BY id, recorded_ms"+inOrder, q.db, schema.BillingCorrections, where),
		[]any{arg}
}

// newID is a random snapshot id (16 hex digits).
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// minutesQuery reads one key's usage_minute per scope and minute, every
// tier summed (earlier corrections included).
type minutesQuery struct {
	db, key, scope string
	from, to       time.Time
}

func (q minutesQuery) toSQL() (string, []any) {
	where, args := "key = ?", []any{q.key}
	if q.scope != "" {
		where += " AND scope = ?"
		args = append(args, q.scope)
	}
	args = append(args, q.from.Unix(), q.to.Unix())
	return fmt.Sprintf("SELECT scope, toUInt32(start) AS b, sum(requests) AS n_req, sum(rejected) AS n_rej, sum(cost) AS n_cost FROM %s.%s"+
		" WHERE %s AND start >= toDateTime(?) AND start < toDateTime(?) GROUP BY scope, b ORDER BY b, scope"+inOrder, q.db, schema.UsageMinute, where), args
}

// eventQuery finds one event of a key in decisions_raw by id. The table is
// ordered by Kafka position, so this reads it whole: a correction is rare.
type eventQuery struct{ db, key, id string }

func (q eventQuery) toSQL() (string, []any) {
	return fmt.Sprintf("SELECT scope, kind, allowed, ts, reserved_ts, actual_cost FROM %s.%s"+
		" WHERE key = ? AND event_id = ? AND kind != 'correction' LIMIT 1"+inOrder, q.db, schema.DecisionsRaw), []any{q.key, q.id}
}

// keysQuery lists the keys of usage_hour over the hours covering [from,
// to); key = ” markers are skipped.
type keysQuery struct {
	db       string
	from, to time.Time
}

func (q keysQuery) toSQL() (string, []any) {
	from, to := q.from.Truncate(time.Hour), q.to.Truncate(time.Hour)
	if to.Before(q.to) {
		to = to.Add(time.Hour)
	}
	return fmt.Sprintf("SELECT DISTINCT key FROM %s.%s WHERE key != '' AND start >= toDateTime(?) AND start < toDateTime(?) ORDER BY key"+inOrder,
		q.db, schema.UsageHour), []any{from.Unix(), to.Unix()}
}

// plansQuery reads one destination's planned rows of one period, each
// identifier's rows first planned first (ties by the row itself, so that
// every reader picks the same one). The table's ORDER BY (destination,
// period, identifier, planned_ms) makes this a range read in that order.
type plansQuery struct{ db, destination, period string }

func (q plansQuery) toSQL() (string, []any) {
	return fmt.Sprintf("SELECT identifier, period, tz, key, line, ref, measure, requests, cost, planned_ms FROM %s.%s"+
			" WHERE destination = ? AND period = ? ORDER BY identifier, planned_ms, key, line, ref, measure, requests, cost"+inOrder,
			q.db, schema.BillingExportPlans),
		[]any{q.destination, q.period}
}
