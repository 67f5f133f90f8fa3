// Package chsink writes decision events into ClickHouse (the tables of
// schema/) so that totals stay exact when the same Kafka messages are written
// again after a crash, a rebalance or an outage.
//
// # Design
//
// The consumer reads one Kafka partition in offset order and hands the sink
// batches: the distinct events of a contiguous offset range (..., last], all
// with event_time in one UTC month. The sink writes a batch as one INSERT
// per table, sent concurrently: decisions_raw (one row per event, settles
// and charges included, with its partition and offset), usage_minute,
// usage_hour and usage_day (one row per key, scope, tier and bucket),
// usage_region_minute/hour/day (the same, per region too, of the events
// that carry a region), shadow_hour (one row per shadow limit, key and
// hour), rollout_shadow (one row per policy rollout and minute) and
// slots_minute (one row per key, scope, region, priority class and minute
// of the slot decisions), each
// rollup plus one marker row, whose key is the empty string (rollout 0),
// that records the partition and `last`. Each INSERT is one block into one
// monthly partition, which ClickHouse applies atomically: after a crash a
// table has either all of an INSERT or none of it.
//
// A settle counts its difference in its reservation's minute, which may be
// in the month before the batch's. Those rows are a carry stream of each
// usage table (CarryMinute, ...): an INSERT of their own into that month,
// with a marker of their own (scope CarryScope), progressing on its own
// like a table; a batch with nothing to carry advances the stream by a
// marker in its table's INSERT. A batch therefore never needs cutting at
// the settles of the month before, and stays one INSERT per table.
//
// So every table knows, on its own, the highest offset it holds for each
// partition (Progress). On (re)start the consumer resumes each partition at
// the lowest of them, and the sink gives each table only the events
// above that table's own progress. A message is therefore counted at most
// once per table however often it is read, and at least once because the
// resume point never passes an offset some table lacks.
package chsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/schema"
)

// Record is one distinct event and its Kafka offset.
type Record struct {
	Offset int64
	Event  metering.Event
}

// Observer is told about every INSERT (duration, rows including markers,
// and the error if it failed). It must be quick and safe for concurrent use.
type Observer func(t Table, rows int, d time.Duration, err error)

// Sink writes batches. Safe for concurrent use by one goroutine per
// partition (never two for the same partition).
type Sink struct {
	conn    driver.Conn
	db      string
	suffix  string // "" or schema.LocalSuffix: which tables of db it writes
	observe Observer
}

// table is the fully qualified name of t that this sink reads and writes.
func (s *Sink) table(t Table) string { return s.db + "." + tableNames[t] + s.suffix }

// Pool is the ClickHouse pool a sink's connection should be opened with
// (chconn.Config.Open): one Write sends an INSERT per table at once, for
// every partition being written.
var Pool = chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: 30 * time.Second, MaxOpenConns: 16}

// New returns a sink writing into database (already migrated with
// schema.Apply). observe may be nil.
func New(conn driver.Conn, database string, observe Observer) (*Sink, error) {
	if !schema.ValidDatabase(database) {
		return nil, fmt.Errorf("chsink: invalid database name %q", database)
	}
	if observe == nil {
		observe = func(Table, int, time.Duration, error) {}
	}
	return &Sink{conn: conn, db: database, observe: observe}, nil
}

// Progress reads from ClickHouse how far each table got in partition.
func (s *Sink) Progress(ctx context.Context, partition int) (Progress, error) {
	var p Progress
	for t := Table(0); t < numTables; t++ {
		// Raw: ORDER BY (kafka_partition, kafka_offset) makes this a range
		// read. Rollups: markers are the key '' prefix of ORDER BY.
		q := "SELECT count(), max(kafka_offset) FROM " + s.table(t) + " WHERE kafka_partition = ?"
		switch {
		case t == Raw, t == IDs:
		case t == RolloutShadow:
			q += " AND rollout = 0"
		case t == ShadowHour:
			q += " AND key = ''"
		case carried[t]:
			q += " AND key = '' AND scope = '" + CarryScope + "'"
		default:
			q += " AND key = '' AND scope = ''"
		}
		var n, maxOff uint64
		if err := s.conn.QueryRow(ctx, q, uint32(partition)).Scan(&n, &maxOff); err != nil {
			return p, fmt.Errorf("chsink: progress of %s partition %d: %w", t, partition, err)
		}
		p[t] = -1
		if n > 0 {
			p[t] = int64(maxOff)
		}
	}
	return p, nil
}

// RecentIDs calls fn, in offset order, for every event id event_ids holds
// for partition at an offset above after (which may be negative), with
// the event's time: the consumer's in-memory deduplication window.
// event_ids holds every distinct event, settles and charges too (which
// decisions_raw holds only from schema 0058 on): a settle delivered again
// after a consumer restart must be found there, or its actual cost counts
// twice. Its time is the last ms of the event's second (event_ids keeps
// seconds): a later bound only makes more messages "late", which costs a
// lookup, never a wrong verdict. When event_ids holds nothing there
// (events consumed before it existed), decisions_raw is read, with the
// events' ms.
func (s *Sink) RecentIDs(ctx context.Context, partition int, after int64, fn func(id string, offset, ts int64)) error {
	found := false
	err := s.recentIDs(ctx, "SELECT event_id, kafka_offset, toUInt64(event_time) * 1000 + 999 FROM "+s.table(IDs)+
		" WHERE kafka_partition = ? AND kafka_offset >= ? ORDER BY kafka_offset", partition, after,
		func(id string, offset, ts int64) { found = true; fn(id, offset, ts) })
	if err != nil || found {
		return err
	}
	return s.recentIDs(ctx, "SELECT event_id, kafka_offset, ts FROM "+s.table(Raw)+
		" WHERE kafka_partition = ? AND kafka_offset >= ? ORDER BY kafka_offset", partition, after, fn)
}

func (s *Sink) recentIDs(ctx context.Context, q string, partition int, after int64, fn func(id string, offset, ts int64)) error {
	rows, err := s.conn.Query(ctx, q, uint32(partition), uint64(max(after+1, 0)))
	if err != nil {
		return fmt.Errorf("chsink: recent ids of partition %d: %w", partition, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var off, ts uint64
		if err := rows.Scan(&id, &off, &ts); err != nil {
			return fmt.Errorf("chsink: recent ids of partition %d: %w", partition, err)
		}
		fn(id, int64(off), int64(ts))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("chsink: recent ids of partition %d: %w", partition, err)
	}
	return nil
}

// carries reports whether e's cost is counted in another month than its
// own (costTime): a carry stream's event, only ever a settle.
func carries(e *metering.Event) bool {
	return e.Kind == metering.KindSettle && e.ReservedTS != 0 && MonthOf(e.ReservedTS) != MonthOf(e.TS)
}

// Write stores a batch of partition: recs are the distinct events of the
// offsets up to and including last, in offset order, whose Months Join.
// Each table gets the records above its own progress in p, and p is advanced
// after each successful INSERT. On error the caller must re-read Progress
// from ClickHouse before writing again (an INSERT that failed on the client
// side may still have been applied).
func (s *Sink) Write(ctx context.Context, partition int, recs []Record, last int64, p *Progress) error {
	if len(recs) > 0 {
		m := MonthsOf(&recs[0].Event)
		for i := range recs {
			var ok bool
			if m, ok = m.Join(MonthsOf(&recs[i].Event)); !ok {
				return fmt.Errorf("chsink: batch of partition %d spans two months (offsets %d and %d)", partition, recs[0].Offset, recs[i].Offset)
			}
		}
	}
	// The INSERTs go out concurrently: each table's progress depends
	// only on its own INSERTs, which stay sequential per partition.
	var wg sync.WaitGroup
	var errs [numTables]error
	// The rollups of one stretch of recs (the tables' progress agree, as
	// they do but after a partial failure) are counted once, per minute,
	// and widened to hours and days.
	type stretch struct {
		from              int // the index of the stretch's first record
		regional, carried bool
	}
	minutes := map[stretch]rollup{}
	rollupOf := func(t Table, from int) rollup {
		k := stretch{from, byRegion[t], carried[t]}
		m, ok := minutes[k]
		if !ok {
			m = aggregate(recs[from:], bucketMillis[Minute], k.regional, k.carried)
			minutes[k] = m
		}
		if bucketMillis[t] == bucketMillis[Minute] {
			return m
		}
		return m.widen(bucketMillis[t])
	}
	above := func(t Table) int {
		from := 0
		for from < len(recs) && recs[from].Offset <= p[t] {
			from++
		}
		return from
	}
	// A carry stream with nothing to carry in its part of the batch puts
	// its marker into its table's own INSERT, when that one is written
	// (most batches: then a carry stream costs one row, no INSERT).
	var piggyback [numTables]bool
	for t := Table(0); t < firstCarry; t++ {
		c := carryOf[t]
		if c == 0 || p[t] >= last || p[c] >= last {
			continue
		}
		piggyback[c] = true
		todo := recs[above(c):]
		for i := range todo { // by index: a Record is a few hundred bytes
			if e := &todo[i].Event; carries(e) && (!byRegion[c] || e.Region != "") {
				piggyback[c] = false
				break
			}
		}
	}
	for t := Table(0); t < numTables; t++ {
		// A carry stream's progress is its table's goroutine's to advance
		// when the marker rides that INSERT: not read here then.
		if piggyback[t] || p[t] >= last {
			continue
		}
		from := above(t)
		todo := recs[from:]
		if t == ShadowHour || t == RolloutShadow {
			// Settle and charge events carry no shadow verdict. The
			// rollups count their actual costs (aggregate), decisions_raw
			// holds them as rows of their kind, and event_ids remembers
			// them for deduplication.
			todo = decisionsOnly(todo)
		}
		if !hasMarkers[t] && len(todo) == 0 {
			continue // no markers: its progress may lag, harmlessly
		}
		var r rollup
		if t == Minute || t == Hour || t == Day || byRegion[t] || carried[t] {
			r = rollupOf(t, from)
		}
		withCarry := carryOf[t] != 0 && piggyback[carryOf[t]]
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			var rows int
			var err error
			switch t {
			case Raw:
				rows, err = s.writeRaw(ctx, partition, todo)
			case IDs:
				rows, err = s.writeIDs(ctx, partition, todo)
			case ShadowHour:
				rows, err = s.writeShadow(ctx, partition, todo, last)
			case RolloutShadow:
				rows, err = s.writeRollout(ctx, partition, todo, last)
			case SlotsMinute:
				rows, err = s.writeSlots(ctx, partition, todo, last)
			default:
				rows, err = s.writeRollup(ctx, t, partition, r, todo, last, withCarry)
			}
			s.observe(t, rows, time.Since(start), err)
			if err != nil {
				errs[t] = err
				return
			}
			if !hasMarkers[t] {
				p[t] = todo[len(todo)-1].Offset
			} else {
				p[t] = last
			}
			if withCarry {
				p[carryOf[t]] = last
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs[:]...)
}

// costTime is the time the rollups count an event's cost at: a settle's
// reservation's decision time, where its estimate was counted (in another
// month, by the carry streams), any other event's own.
func costTime(e *metering.Event) int64 {
	if e.Kind != metering.KindSettle || e.ReservedTS == 0 {
		return e.TS
	}
	return e.ReservedTS
}

// decisionsOnly is recs without settle and charge events, in place when
// there are none.
func decisionsOnly(recs []Record) []Record {
	for i := range recs {
		if !recs[i].Event.IsDecision() {
			out := append([]Record(nil), recs[:i]...)
			for j := i + 1; j < len(recs); j++ {
				if recs[j].Event.IsDecision() {
					out = append(out, recs[j])
				}
			}
			return out
		}
	}
	return recs
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// kindOf is an event's kind as decisions_raw spells it: an event without
// one is a decision.
func kindOf(e *metering.Event) string {
	if e.Kind == "" {
		return metering.KindDecision
	}
	return e.Kind
}

// actualCost is an event's part of its key's actual cost (decisions_raw's
// actual_cost): an allowed decision's cost (a reservation's estimate,
// which its settle corrects), a settle's or a correction's actual −
// estimate, a charge's actual, nothing for a rejection.
func actualCost(e *metering.Event) int64 {
	switch {
	case e.Kind == metering.KindSettle, e.Kind == metering.KindCorrection:
		return int64(e.Actual) - int64(e.Estimate)
	case e.Kind == metering.KindCharge:
		return int64(e.Actual)
	case e.Allowed:
		return int64(e.Cost)
	}
	return 0
}

// insert sends one block of columns (in the order of columns) into table t.
func (s *Sink) insert(ctx context.Context, t Table, columns string, cols []any) error {
	for i, name := range strings.Split(columns, ", ") {
		expectColumn(name, cols[i])
	}
	// Explicit column list: 18.16 sees 0 columns without one.
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.table(t)+" ("+columns+")")
	if err != nil {
		return fmt.Errorf("chsink: prepare insert into %s: %w", t, err)
	}
	for i, c := range cols {
		if err := b.Column(i).Append(c); err != nil {
			_ = b.Abort()
			return fmt.Errorf("chsink: %s column %d: %w", t, i, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("chsink: insert into %s: %w", t, err)
	}
	return nil
}
