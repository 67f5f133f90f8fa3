// Package chsink writes decision events into ClickHouse (the tables of
// schema/) so that totals stay exact when the same Kafka messages are written
// again after a crash, a rebalance or an outage.
//
// # Design
//
// The consumer reads one Kafka partition in offset order and hands the sink
// batches: the distinct events of a contiguous offset range (..., last], all
// with event_time in one UTC month. The sink writes a batch as six INSERTs,
// sent concurrently, one per table: decisions_raw (one row per event, with
// its partition and offset), usage_minute, usage_hour and usage_day (one row
// per key, scope, tier and bucket), shadow_hour (one row per shadow limit,
// key and hour) and rollout_shadow (one row per policy rollout and minute),
// each rollup plus one marker row, whose key is the empty string (rollout
// 0), that records the partition and `last`. Each INSERT is one
// block into one monthly partition, which ClickHouse applies atomically:
// after a crash a table has either all of an INSERT or none of it.
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
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/schema"
)

// Table identifies one of the tables the sink writes.
type Table int

// The tables, in the order a batch is written.
const (
	Raw Table = iota
	Minute
	Hour
	Day
	ShadowHour
	RolloutShadow
	// IDs is event_ids: each distinct event's id and position once, the
	// consumer's long deduplication window (LateIDs).
	IDs
	numTables
)

var tableNames = [numTables]string{schema.DecisionsRaw, schema.UsageMinute, schema.UsageHour, schema.UsageDay, schema.ShadowHour, schema.RolloutShadow, schema.EventIDs}

// addedLater marks tables created by a later migration than the others: until
// such a table holds a marker of a partition, it does not pull that
// partition's resume point back, so an upgraded consumer does not re-read its
// topic from the start (the new table starts with the next batch; the shadow
// verdicts of events consumed before the upgrade are in decisions_raw).
var addedLater = [numTables]bool{ShadowHour: true, RolloutShadow: true, IDs: true}

// hasMarkers: the rollups carry a marker row per INSERT; decisions_raw and
// event_ids hold one row per event, whose highest offset is the progress.
var hasMarkers = [numTables]bool{Minute: true, Hour: true, Day: true, ShadowHour: true, RolloutShadow: true}

// String is the table's name in ClickHouse.
func (t Table) String() string { return tableNames[t] }

var bucketMillis = [numTables]int64{0, 60_000, 3_600_000, 86_400_000, 3_600_000, 60_000, 0}

// Progress is, per table, the highest Kafka offset of one partition that the
// table holds; -1 when it holds none.
type Progress [numTables]int64

// Resume is the first offset to read: one past the lowest table progress.
func (p Progress) Resume() int64 {
	m := p[0]
	for t, v := range p[1:] {
		if addedLater[t+1] && v < 0 {
			continue
		}
		m = min(m, v)
	}
	return m + 1
}

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
func (s *Sink) table(t Table) string { return s.db + "." + t.String() + s.suffix }

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
		switch t {
		case Raw, IDs:
		case RolloutShadow:
			q += " AND rollout = 0"
		default:
			q += " AND key = ''"
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

// RecentIDs calls fn, in offset order, for every event id decisions_raw
// holds for partition at an offset above after (which may be negative),
// with the event's ts: the consumer's in-memory deduplication window.
func (s *Sink) RecentIDs(ctx context.Context, partition int, after int64, fn func(id string, offset, ts int64)) error {
	rows, err := s.conn.Query(ctx, "SELECT event_id, kafka_offset, ts FROM "+s.table(Raw)+" WHERE kafka_partition = ? AND kafka_offset >= ? ORDER BY kafka_offset",
		uint32(partition), uint64(max(after+1, 0)))
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

// MonthOf is the UTC calendar month of a ms timestamp, as year*12+month:
// the unit a batch must not span.
func MonthOf(tsMillis int64) int {
	t := time.UnixMilli(tsMillis).UTC()
	return t.Year()*12 + int(t.Month())
}

// Write stores a batch of partition: recs are the distinct events of the
// offsets up to and including last, in offset order, all in one UTC month.
// Each table gets the records above its own progress in p, and p is advanced
// after each successful INSERT. On error the caller must re-read Progress
// from ClickHouse before writing again (an INSERT that failed on the client
// side may still have been applied).
func (s *Sink) Write(ctx context.Context, partition int, recs []Record, last int64, p *Progress) error {
	if len(recs) > 0 {
		m := MonthOf(recs[0].Event.TS)
		for i := range recs {
			if MonthOf(recs[i].Event.TS) != m {
				return fmt.Errorf("chsink: batch of partition %d spans two months (offsets %d and %d)", partition, recs[0].Offset, recs[i].Offset)
			}
		}
	}
	// The INSERTs go out concurrently: each table's progress depends
	// only on its own INSERTs, which stay sequential per partition.
	var wg sync.WaitGroup
	var errs [numTables]error
	for t := Table(0); t < numTables; t++ {
		if p[t] >= last {
			continue
		}
		from := 0
		for from < len(recs) && recs[from].Offset <= p[t] {
			from++
		}
		todo := recs[from:]
		if t == Raw || t == ShadowHour || t == RolloutShadow {
			// Settle and charge events are not decisions: only the
			// rollups count them (their actual costs, writeRollup), and
			// event_ids remembers them for deduplication.
			todo = decisionsOnly(todo)
		}
		if !hasMarkers[t] && len(todo) == 0 {
			continue // no markers: its progress may lag, harmlessly
		}
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
			default:
				rows, err = s.writeRollup(ctx, t, partition, todo, last)
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
		}()
	}
	wg.Wait()
	return errors.Join(errs[:]...)
}

// costTime is the time a settle's or a charge's cost is counted at: a
// settle's reservation's decision time, a charge's own. ok is false for a
// settle whose reservation was made in another month than the settle
// (the batch's partition): its difference is not counted, and the
// estimate stands for it.
func costTime(e *metering.Event) (int64, bool) {
	if e.Kind != metering.KindSettle || e.ReservedTS == 0 {
		return e.TS, e.Kind == metering.KindCharge
	}
	return e.ReservedTS, MonthOf(e.ReservedTS) == MonthOf(e.TS)
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

func (s *Sink) writeRaw(ctx context.Context, partition int, recs []Record) (int, error) {
	n := len(recs)
	var (
		ids, keys, scopes, tiers, sources, policies, instances = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		domains, shadows                                       = make([]string, n), make([]string, n)
		ts, costs, offsets                                     = make([]uint64, n), make([]uint64, n), make([]uint64, n)
		times                                                  = make([]time.Time, n)
		allowed, dry, warn, shadowRejected                     = make([]uint8, n), make([]uint8, n), make([]uint8, n), make([]uint8, n)
		remaining, limits                                      = make([]int64, n), make([]int64, n)
		parts                                                  = make([]uint32, n)
		traces                                                 = make([]*string, n) // NULL: not traced
		// Nullable: NULL when the event has none (file mode, a local
		// decision, an older event); the pointers point into nullable.
		revisions, decided, shadowRevs = make([]*int64, n), make([]*int64, n), make([]*int64, n)
		nullable                       = make([]int64, 2*n)
	)
	for i := range recs {
		if e := &recs[i].Event; e.ShadowRevision != 0 {
			shadowRevs[i] = &e.ShadowRevision
		}
		if e := &recs[i].Event; e.PolicyRevision != 0 || e.DecidedUS != 0 {
			nullable[2*i], nullable[2*i+1] = e.PolicyRevision, e.DecidedUS
			if e.PolicyRevision != 0 {
				revisions[i] = &nullable[2*i]
			}
			if e.DecidedUS != 0 {
				decided[i] = &nullable[2*i+1]
			}
		}
		e := &recs[i].Event
		ids[i], keys[i], scopes[i], tiers[i] = e.EventID, e.Key, e.Scope, e.Tier
		sources[i], policies[i], instances[i] = e.Source, e.Policy, e.Instance
		ts[i], costs[i], offsets[i] = uint64(e.TS), e.Cost, uint64(recs[i].Offset)
		times[i] = time.Unix(e.TS/1000, 0).UTC()
		allowed[i], dry[i], warn[i] = b2u(e.Allowed), b2u(e.DryRun), b2u(e.Warning)
		remaining[i], limits[i] = e.Remaining, e.Limit
		domains[i], shadows[i], shadowRejected[i] = e.Domain, e.Shadow, b2u(e.ShadowRejected)
		parts[i] = uint32(partition)
		if e.TraceID != "" {
			traces[i] = &e.TraceID
		}
	}
	if err := s.insert(ctx, Raw, "event_id, ts, event_time, key, scope, tier, cost, allowed, source, remaining, limit_value, policy, dry_run, warning, instance, kafka_partition, kafka_offset, domain, shadow, shadow_rejected, trace_id, policy_revision, decided_us, shadow_revision",
		[]any{ids, ts, times, keys, scopes, tiers, costs, allowed, sources, remaining, limits, policies, dry, warn, instances, parts, offsets, domains, shadows, shadowRejected, traces, revisions, decided, shadowRevs}); err != nil {
		return 0, err
	}
	return n, nil
}

func (s *Sink) writeIDs(ctx context.Context, partition int, recs []Record) (int, error) {
	n := len(recs)
	parts, times, ids, offsets := make([]uint32, n), make([]time.Time, n), make([]string, n), make([]uint64, n)
	for i := range recs {
		parts[i], times[i], ids[i], offsets[i] = uint32(partition), time.Unix(recs[i].Event.TS/1000, 0).UTC(), recs[i].Event.EventID, uint64(recs[i].Offset)
	}
	if err := s.insert(ctx, IDs, "kafka_partition, event_time, event_id, kafka_offset", []any{parts, times, ids, offsets}); err != nil {
		return 0, err
	}
	return n, nil
}

type bucketKey struct {
	key, scope, tier string
	start            int64 // ms
}

type counters struct {
	requests, allowed, rejected, cost, warnings uint64
}

func (s *Sink) writeRollup(ctx context.Context, t Table, partition int, recs []Record, last int64) (int, error) {
	width := bucketMillis[t]
	agg := make(map[bucketKey]*counters, 64)
	var order []bucketKey
	for i := range recs {
		e := &recs[i].Event
		at := e.TS
		if !e.IsDecision() {
			var ok bool
			if at, ok = costTime(e); !ok {
				continue
			}
		}
		k := bucketKey{e.Key, e.Scope, e.Tier, at - at%width}
		c := agg[k]
		if c == nil {
			c = &counters{}
			agg[k] = c
			order = append(order, k)
		}
		if !e.IsDecision() {
			// The actual cost: a settle adds actual − estimate in its
			// reservation's bucket, where the estimate was counted (a
			// refund is a subtraction, in UInt64's modular arithmetic:
			// sum() of the bucket is the actual cost, never below 0); a
			// charge adds its cost. Neither is a request.
			c.cost += e.Actual - e.Estimate
			continue
		}
		c.requests++
		if e.Allowed {
			c.allowed++
			c.cost += e.Cost
		} else {
			c.rejected++
		}
		if e.Warning {
			c.warnings++
		}
	}
	n := len(order) + 1
	var (
		keys, scopes, tiers                                  = make([]string, n), make([]string, n), make([]string, n)
		starts                                               = make([]time.Time, n)
		requests, allowed, rejected, cost, warnings, batches = make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
		parts                                                = make([]uint32, n)
		offsets                                              = make([]uint64, n)
	)
	for i, k := range order {
		c := agg[k]
		keys[i], scopes[i], tiers[i] = k.key, k.scope, k.tier
		starts[i] = time.UnixMilli(k.start).UTC()
		requests[i], allowed[i], rejected[i], cost[i], warnings[i] = c.requests, c.allowed, c.rejected, c.cost, c.warnings
	}
	// The marker: key '' (never a rate-limit key), counters 0, batches 1,
	// in the same monthly partition as the rows so the INSERT stays atomic.
	m := n - 1
	starts[m] = markerStart(recs)
	batches[m], parts[m], offsets[m] = 1, uint32(partition), uint64(last)
	if err := s.insert(ctx, t, "key, scope, tier, start, requests, allowed, rejected, cost, warnings, batches, kafka_partition, kafka_offset",
		[]any{keys, scopes, tiers, starts, requests, allowed, rejected, cost, warnings, batches, parts, offsets}); err != nil {
		return 0, err
	}
	return n, nil
}

type shadowKey struct {
	shadow, key string
	start       int64 // ms
}

type shadowCounters struct {
	decisions, wouldReject, rejected uint64
}

// writeShadow writes the shadow verdicts of recs, per shadow limit, key and
// hour, with the batch's marker (also when no event carried a verdict).
func (s *Sink) writeShadow(ctx context.Context, partition int, recs []Record, last int64) (int, error) {
	width := bucketMillis[ShadowHour]
	agg := make(map[shadowKey]*shadowCounters)
	var order []shadowKey
	for i := range recs {
		e := &recs[i].Event
		if e.Shadow == "" {
			continue
		}
		k := shadowKey{e.Shadow, e.Key, e.TS - e.TS%width}
		c := agg[k]
		if c == nil {
			c = &shadowCounters{}
			agg[k] = c
			order = append(order, k)
		}
		c.decisions++
		if e.ShadowRejected {
			c.wouldReject++
		}
		if !e.Allowed {
			c.rejected++
		}
	}
	n := len(order) + 1
	var (
		shadows, keys                             = make([]string, n), make([]string, n)
		starts                                    = make([]time.Time, n)
		decisions, wouldReject, rejected, batches = make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
		parts                                     = make([]uint32, n)
		offsets                                   = make([]uint64, n)
	)
	for i, k := range order {
		c := agg[k]
		shadows[i], keys[i], starts[i] = k.shadow, k.key, time.UnixMilli(k.start).UTC()
		decisions[i], wouldReject[i], rejected[i] = c.decisions, c.wouldReject, c.rejected
	}
	m := n - 1
	starts[m] = markerStart(recs)
	batches[m], parts[m], offsets[m] = 1, uint32(partition), uint64(last)
	if err := s.insert(ctx, ShadowHour, "shadow, key, start, decisions, would_reject, rejected, batches, kafka_partition, kafka_offset",
		[]any{shadows, keys, starts, decisions, wouldReject, rejected, batches, parts, offsets}); err != nil {
		return 0, err
	}
	return n, nil
}

type rolloutKey struct {
	rollout int64
	start   int64 // ms
}

// writeRollout writes the shadow verdicts of rollouts' candidates in recs,
// per rollout and minute, with the batch's marker (rollout 0; also when no
// event carried such a verdict).
func (s *Sink) writeRollout(ctx context.Context, partition int, recs []Record, last int64) (int, error) {
	width := bucketMillis[RolloutShadow]
	agg := make(map[rolloutKey]*[4]uint64) // decisions, newly rejected, would reject, rejected
	var order []rolloutKey
	for i := range recs {
		e := &recs[i].Event
		if e.ShadowRevision == 0 || e.Shadow == "" {
			continue
		}
		k := rolloutKey{e.ShadowRevision, e.TS - e.TS%width}
		c := agg[k]
		if c == nil {
			c = &[4]uint64{}
			agg[k] = c
			order = append(order, k)
		}
		c[0]++
		if e.ShadowRejected && e.Allowed {
			c[1]++
		}
		if e.ShadowRejected {
			c[2]++
		}
		if !e.Allowed {
			c[3]++
		}
	}
	n := len(order) + 1
	var (
		rollouts                                                  = make([]int64, n)
		starts                                                    = make([]time.Time, n)
		decisions, newly, wouldReject, rejected, batches, offsets = make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
		parts                                                     = make([]uint32, n)
	)
	for i, k := range order {
		c := agg[k]
		rollouts[i], starts[i] = k.rollout, time.UnixMilli(k.start).UTC()
		decisions[i], newly[i], wouldReject[i], rejected[i] = c[0], c[1], c[2], c[3]
	}
	m := n - 1
	starts[m] = markerStart(recs)
	batches[m], parts[m], offsets[m] = 1, uint32(partition), uint64(last)
	if err := s.insert(ctx, RolloutShadow, "rollout, start, decisions, newly_rejected, would_reject, rejected, batches, kafka_partition, kafka_offset",
		[]any{rollouts, starts, decisions, newly, wouldReject, rejected, batches, parts, offsets}); err != nil {
		return 0, err
	}
	return n, nil
}

// markerStart is the start of a batch's marker row: a day start in the
// batch's month, so that the INSERT stays in one monthly partition.
func markerStart(recs []Record) time.Time {
	t := time.Now().UTC()
	if len(recs) > 0 {
		t = time.UnixMilli(recs[0].Event.TS).UTC()
	}
	return t.Truncate(24 * time.Hour)
}

// insert sends one block of columns (in the order of columns) into table t.
func (s *Sink) insert(ctx context.Context, t Table, columns string, cols []any) error {
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
