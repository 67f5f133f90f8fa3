// Package chstore is billing's ClickHouse adapter: it sums the usage
// rollups and the raw record for statements, and keeps the frozen
// statements (billing_statements) and the corrections' audit records
// (billing_corrections). Every query is a small struct with a toSQL
// method; request values are bound arguments, only constants and the
// validated database name are SQL text.
package chstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/schema"
)

// Store reads and writes billing's tables in one database. Safe for
// concurrent use.
type Store struct {
	conn driver.Conn
	db   string
	ids  func() string // snapshot ids
}

var _ billing.Store = (*Store)(nil)

// New returns a Store over conn for database db (schema.ValidDatabase).
func New(conn driver.Conn, db string) (*Store, error) {
	if !schema.ValidDatabase(db) {
		return nil, fmt.Errorf("chstore: invalid database name %q", db)
	}
	return &Store{conn: conn, db: db, ids: newID}, nil
}

// wrap classifies a driver error: a server exception is a bug or bad data;
// anything else (network, timeout) means unavailable.
func wrap(op string, err error) error {
	var exc *clickhouse.Exception
	if errors.As(err, &exc) {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %w: %v", op, billing.ErrUnavailable, err)
}

// Usage sums the rollups of key over [from, to), both whole minutes: the
// whole UTC hours inside from usage_hour, the minutes at either edge from
// usage_minute (a month in Asia/Kolkata starts at 18:30 UTC).
func (s *Store) Usage(ctx context.Context, key string, from, to time.Time) ([]billing.Row, error) {
	var out []billing.Row
	for _, q := range planUsage(s.db, key, from, to) {
		rows, err := s.sums(ctx, q)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

func (s *Store) sums(ctx context.Context, q usageQuery) ([]billing.Row, error) {
	sql, args := q.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing usage query", err)
	}
	defer rows.Close()
	var out []billing.Row
	for rows.Next() {
		var r billing.Row
		var req, cost uint64
		if err := rows.Scan(&r.Scope, &r.Tier, &req, &cost); err != nil {
			return nil, wrap("billing usage scan", err)
		}
		// The counters are UInt64 summed modulo 2^64: a correction's
		// rows subtract, and their sum read as signed is its net.
		r.Requests, r.Cost = int64(req), int64(cost)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("billing usage rows", err)
	}
	return out, nil
}

// Raw sums decisions_raw for key's events counted in [from, to): requests
// are the decisions, cost their actual cost (a settle's difference counted
// at its reservation's time, as the rollups count it). Corrections are
// left out: they are checked against their audit records.
func (s *Store) Raw(ctx context.Context, key string, from, to time.Time) ([]billing.Row, error) {
	sql, args := rawQuery{db: s.db, key: key, from: from, to: to}.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing raw query", err)
	}
	defer rows.Close()
	var out []billing.Row
	for rows.Next() {
		var r billing.Row
		if err := rows.Scan(&r.Scope, &r.Requests, &r.Cost); err != nil {
			return nil, wrap("billing raw scan", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("billing raw rows", err)
	}
	return out, nil
}

// Snapshots are key's frozen statements in zone tz, the first written of
// each period.
func (s *Store) Snapshots(ctx context.Context, key, tz string) ([]billing.Snapshot, error) {
	sql, args := snapshotsQuery{db: s.db, key: key, tz: tz}.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing snapshots query", err)
	}
	defer rows.Close()
	var out []billing.Snapshot
	var curPeriod, curSnap string
	skip := false
	for rows.Next() {
		var period, snap string
		var ms uint64
		var l billing.Line
		if err := rows.Scan(&period, &snap, &ms, &l.Kind, &l.Scope, &l.Unit, &l.Ref, &l.Requests, &l.Cost); err != nil {
			return nil, wrap("billing snapshots scan", err)
		}
		if period != curPeriod { // rows are ordered by period, then the first written snapshot
			curPeriod, curSnap, skip = period, snap, false
			out = append(out, billing.Snapshot{Period: period, FinalizedAt: time.UnixMilli(int64(ms)).UTC()})
		} else if snap != curSnap {
			skip = true // a later snapshot of the same period: not the statement
		}
		if !skip && l.Kind != "" {
			out[len(out)-1].Lines = append(out[len(out)-1].Lines, l)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("billing snapshots rows", err)
	}
	return out, nil
}

// WriteSnapshot writes a period's lines in one INSERT (one block, atomic).
// A period without any line gets one empty row, so that it is frozen too.
func (s *Store) WriteSnapshot(ctx context.Context, key, tz string, snap billing.Snapshot) error {
	b, err := s.conn.PrepareBatch(syncInsert(ctx), "INSERT INTO "+s.db+"."+schema.BillingStatements+
		" (key, tz, period, snapshot, finalized_at, finalized_ms, line, scope, unit, ref, requests, cost)")
	if err != nil {
		return wrap("billing snapshot prepare", err)
	}
	defer b.Abort()
	id := s.ids()
	at := snap.FinalizedAt.UTC()
	lines := snap.Lines
	if len(lines) == 0 {
		lines = []billing.Line{{}}
	}
	for _, l := range lines {
		if err := b.Append(key, tz, snap.Period, id, at.Truncate(time.Second), uint64(at.UnixMilli()), l.Kind, l.Scope, l.Unit, l.Ref, l.Requests, l.Cost); err != nil {
			return wrap("billing snapshot append", err)
		}
	}
	if err := b.Send(); err != nil {
		return wrap("billing snapshot insert", err)
	}
	return s.visible(ctx, "SELECT count() FROM "+s.db+"."+schema.BillingStatements+" WHERE key = ? AND tz = ? AND period = ? AND snapshot = ?"+inOrder,
		[]any{key, tz, snap.Period, id}, uint64(len(lines)))
}

// Corrections are key's corrections, the first recorded of each id.
func (s *Store) Corrections(ctx context.Context, key string) ([]billing.Correction, error) {
	return s.corrections(ctx, correctionsQuery{db: s.db, key: key})
}

// Correction is the correction recorded under id; ok is false when none is.
func (s *Store) Correction(ctx context.Context, id string) (c billing.Correction, ok bool, err error) {
	cs, err := s.corrections(ctx, correctionsQuery{db: s.db, id: id})
	if err != nil || len(cs) == 0 {
		return billing.Correction{}, false, err
	}
	return cs[0], true, nil
}

func (s *Store) corrections(ctx context.Context, q correctionsQuery) ([]billing.Correction, error) {
	sql, args := q.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing corrections query", err)
	}
	defer rows.Close()
	var out []billing.Correction
	for rows.Next() {
		var c billing.Correction
		var fromMS, toMS, atMS uint64
		var pieces string
		if err := rows.Scan(&c.ID, &c.Key, &c.Kind, &c.Scope, &fromMS, &toMS, &c.EventID, &c.Reason, &c.Operator, &c.Request, &pieces, &atMS); err != nil {
			return nil, wrap("billing corrections scan", err)
		}
		if len(out) > 0 && out[len(out)-1].ID == c.ID {
			continue // a later record of the same id (a race): the first one holds
		}
		if err := json.Unmarshal([]byte(pieces), &c.Pieces); err != nil {
			return nil, fmt.Errorf("billing: correction %s: pieces: %w", c.ID, err)
		}
		if fromMS != 0 || toMS != 0 {
			c.From, c.To = time.UnixMilli(int64(fromMS)).UTC(), time.UnixMilli(int64(toMS)).UTC()
		}
		c.RecordedAt = time.UnixMilli(int64(atMS)).UTC()
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("billing corrections rows", err)
	}
	return out, nil
}

// WriteCorrection records c (one row, one INSERT).
func (s *Store) WriteCorrection(ctx context.Context, c billing.Correction) error {
	pieces, err := json.Marshal(c.Pieces)
	if err != nil {
		return err
	}
	b, err := s.conn.PrepareBatch(syncInsert(ctx), "INSERT INTO "+s.db+"."+schema.BillingCorrections+
		" (id, key, kind, scope, from_ms, to_ms, event_id, reason, operator, request, pieces, requests, cost, recorded_at, recorded_ms)")
	if err != nil {
		return wrap("billing correction prepare", err)
	}
	defer b.Abort()
	var fromMS, toMS uint64
	if !c.From.IsZero() {
		fromMS, toMS = uint64(c.From.UnixMilli()), uint64(c.To.UnixMilli())
	}
	net := c.Net()
	at := c.RecordedAt.UTC()
	if err := b.Append(c.ID, c.Key, c.Kind, c.Scope, fromMS, toMS, c.EventID, c.Reason, c.Operator, c.Request, string(pieces),
		net.Requests, net.Cost, at.Truncate(time.Second), uint64(at.UnixMilli())); err != nil {
		return wrap("billing correction append", err)
	}
	if err := b.Send(); err != nil {
		return wrap("billing correction insert", err)
	}
	return s.visible(ctx, "SELECT count() FROM "+s.db+"."+schema.BillingCorrections+" WHERE id = ? AND recorded_ms = ? AND operator = ?"+inOrder,
		[]any{c.ID, uint64(at.UnixMilli()), c.Operator}, 1)
}

var _ billing.CorrectionStore = (*Store)(nil)

// Minutes are key's usage (one scope's, unless scope is "") per scope and
// minute over [from, to), net of earlier corrections: what a void of the
// range negates.
func (s *Store) Minutes(ctx context.Context, key, scope string, from, to time.Time) ([]billing.Piece, error) {
	sql, args := minutesQuery{db: s.db, key: key, scope: scope, from: from, to: to}.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing minutes query", err)
	}
	defer rows.Close()
	var out []billing.Piece
	for rows.Next() {
		var p billing.Piece
		var start uint32
		var req, rej, cost uint64
		if err := rows.Scan(&p.Scope, &start, &req, &rej, &cost); err != nil {
			return nil, wrap("billing minutes scan", err)
		}
		p.TS, p.Requests, p.Rejected, p.Cost = int64(start)*1000, int64(req), int64(rej), int64(cost)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("billing minutes rows", err)
	}
	return out, nil
}

// Event is the raw record's event id of key (decisions, settles and
// charges; not a correction's own events).
func (s *Store) Event(ctx context.Context, key, id string) (billing.RawEvent, bool, error) {
	sql, args := eventQuery{db: s.db, key: key, id: id}.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return billing.RawEvent{}, false, wrap("billing event query", err)
	}
	defer rows.Close()
	if !rows.Next() {
		return billing.RawEvent{}, false, wrap2("billing event rows", rows.Err())
	}
	var ev billing.RawEvent
	var kind string
	var allowed uint8
	var ts, reserved uint64
	if err := rows.Scan(&ev.Scope, &kind, &allowed, &ts, &reserved, &ev.ActualCost); err != nil {
		return billing.RawEvent{}, false, wrap("billing event scan", err)
	}
	ev.Key, ev.CostTS = key, int64(ts)
	if kind == "settle" && reserved != 0 {
		ev.CostTS = int64(reserved)
	}
	ev.Request = kind == "decision"
	ev.Reject = ev.Request && allowed == 0
	return ev, true, nil
}

// wrap2 is wrap of an error that may be nil.
func wrap2(op string, err error) error {
	if err == nil {
		return nil
	}
	return wrap(op, err)
}

var _ billing.ExportStore = (*Store)(nil)

// Keys are the keys with usage in the whole UTC hours that cover [from,
// to): a few more than the range holds, never fewer.
func (s *Store) Keys(ctx context.Context, from, to time.Time) ([]string, error) {
	sql, args := keysQuery{db: s.db, from: from, to: to}.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing keys query", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, wrap("billing keys scan", err)
		}
		out = append(out, k)
	}
	return out, wrap2("billing keys rows", rows.Err())
}

// Exported are the identifiers recorded as exported to destination for
// period.
func (s *Store) Exported(ctx context.Context, destination, period string) (map[string]bool, error) {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT identifier FROM "+s.db+"."+schema.BillingExports+
		" WHERE destination = ? AND period = ?"+inOrder, destination, period)
	if err != nil {
		return nil, wrap("billing exported query", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, wrap("billing exported scan", err)
		}
		out[id] = true
	}
	return out, wrap2("billing exported rows", rows.Err())
}

// RecordExport records rows as exported to destination (one INSERT).
func (s *Store) RecordExport(ctx context.Context, destination string, rows []billing.ExportRow, at time.Time) error {
	b, err := s.conn.PrepareBatch(syncInsert(ctx), "INSERT INTO "+s.db+"."+schema.BillingExports+
		" (destination, period, tz, identifier, key, line, scope, ref, measure, requests, cost, exported_at, exported_ms)")
	if err != nil {
		return wrap("billing export prepare", err)
	}
	defer b.Abort()
	at = at.UTC()
	for _, r := range rows {
		if err := b.Append(destination, r.Period, r.TZ, r.Identifier, r.Key, r.Line, r.Scope, r.Ref, r.Measure, r.Requests, r.Cost,
			at.Truncate(time.Second), uint64(at.UnixMilli())); err != nil {
			return wrap("billing export append", err)
		}
	}
	if err := b.Send(); err != nil {
		return wrap("billing export insert", err)
	}
	return nil
}

// Plans are the rows planned for destination in period, the first planned
// of each identifier, in the order they were planned.
func (s *Store) Plans(ctx context.Context, destination, period string) ([]billing.ExportRow, error) {
	sql, args := plansQuery{db: s.db, destination: destination, period: period}.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("billing plans query", err)
	}
	defer rows.Close()
	type planned struct {
		row billing.ExportRow
		ms  uint64
	}
	var first []planned
	for rows.Next() {
		var p planned
		r := &p.row
		if err := rows.Scan(&r.Identifier, &r.Period, &r.TZ, &r.Key, &r.Line, &r.Ref, &r.Measure, &r.Requests, &r.Cost, &p.ms); err != nil {
			return nil, wrap("billing plans scan", err)
		}
		if len(first) > 0 && first[len(first)-1].row.Identifier == r.Identifier {
			continue // planned again (two exports at once): the first holds
		}
		first = append(first, p)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("billing plans rows", err)
	}
	slices.SortStableFunc(first, func(a, b planned) int { return cmp.Compare(a.ms, b.ms) })
	out := make([]billing.ExportRow, len(first))
	for i, p := range first {
		out[i] = p.row
	}
	return out, nil
}

// Plan records rows as about to be sent to destination (one INSERT).
func (s *Store) Plan(ctx context.Context, destination string, rows []billing.ExportRow, at time.Time) error {
	b, err := s.conn.PrepareBatch(syncInsert(ctx), "INSERT INTO "+s.db+"."+schema.BillingExportPlans+
		" (destination, period, tz, identifier, key, line, ref, measure, requests, cost, planned_at, planned_ms)")
	if err != nil {
		return wrap("billing plan prepare", err)
	}
	defer b.Abort()
	at = at.UTC()
	for _, r := range rows {
		if err := b.Append(destination, r.Period, r.TZ, r.Identifier, r.Key, r.Line, r.Ref, r.Measure, r.Requests, r.Cost,
			at.Truncate(time.Second), uint64(at.UnixMilli())); err != nil {
			return wrap("billing plan append", err)
		}
	}
	if err := b.Send(); err != nil {
		return wrap("billing plan insert", err)
	}
	if len(rows) == 0 {
		return nil
	}
	return s.visible(ctx, "SELECT count() FROM "+s.db+"."+schema.BillingExportPlans+" WHERE destination = ? AND period = ? AND planned_ms = ?"+inOrder,
		[]any{destination, rows[0].Period, uint64(at.UnixMilli())}, uint64(len(rows)))
}

// syncInsert makes an INSERT into a Distributed table (cluster mode)
// reach its shard before it returns, instead of being queued on this
// node; without effect on a MergeTree.
func syncInsert(ctx context.Context) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
}

// inOrder ends every read: through a Distributed table (cluster mode) it
// goes to the first healthy replica of each shard, always the same, so
// that once a write is visible there (visible) every later read sees it,
// rather than the shard's other replica before replication has copied
// the part; without effect on a MergeTree. (A setting of the query's
// text: the native protocol of older servers takes only numeric
// settings from the client.)
const inOrder = " SETTINGS load_balancing = 'in_order'"

// visible waits until query (a count) reaches want: a row written is read
// back at once on one server, while in cluster mode the read may go to
// the shard's other replica before replication has copied the part. The
// callers read back what they wrote (the first snapshot, correction or
// plan written wins), so they need their own write visible. ctx bounds
// the wait.
func (s *Store) visible(ctx context.Context, query string, args []any, want uint64) error {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var n uint64
		if err := s.conn.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			return wrap("billing read back", err)
		}
		if n >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return wrap("billing read back", fmt.Errorf("%d of %d rows written are visible: %w", n, want, ctx.Err()))
		case <-time.After(wait):
		}
	}
}
