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
// hour) and rollout_shadow (one row per policy rollout and minute), each
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
	// RegionMinute, RegionHour and RegionDay are usage_region_*: the
	// usage rollups per region as well, of the events that carry one.
	RegionMinute
	RegionHour
	RegionDay
	// CarryMinute to CarryRegionDay are the six usage rollups again, as
	// the stream of the differences that settles carry into another month
	// than their own (their reservations': the month before). Those rows
	// go to that month's partition, so they are an INSERT of their own,
	// with a marker of their own (scope CarryScope) and so a progress of
	// their own: a batch may then hold a month's events and the settles
	// of the month before side by side, and each INSERT stays atomic. A
	// batch that carries nothing puts the carry marker into the table's
	// own INSERT instead.
	CarryMinute
	CarryHour
	CarryDay
	CarryRegionMinute
	CarryRegionHour
	CarryRegionDay
	numTables
)

// firstCarry is the first carry table: the tables below it are the
// distinct ClickHouse tables.
const firstCarry = CarryMinute

// CarryScope is the scope of a carry stream's markers (rows whose key is
// empty); the table's own markers have an empty scope.
const CarryScope = "carry"

var tableNames = [numTables]string{schema.DecisionsRaw, schema.UsageMinute, schema.UsageHour, schema.UsageDay, schema.ShadowHour, schema.RolloutShadow, schema.EventIDs,
	schema.UsageRegionMinute, schema.UsageRegionHour, schema.UsageRegionDay,
	schema.UsageMinute, schema.UsageHour, schema.UsageDay, schema.UsageRegionMinute, schema.UsageRegionHour, schema.UsageRegionDay}

// carryOf is a usage rollup's carry stream (0 for any other table), and
// carried marks the carry streams.
var (
	carryOf = [numTables]Table{Minute: CarryMinute, Hour: CarryHour, Day: CarryDay,
		RegionMinute: CarryRegionMinute, RegionHour: CarryRegionHour, RegionDay: CarryRegionDay}
	carried = [numTables]bool{CarryMinute: true, CarryHour: true, CarryDay: true,
		CarryRegionMinute: true, CarryRegionHour: true, CarryRegionDay: true}
)

// addedLater marks tables created by a later migration than the others: until
// such a table holds a marker of a partition, it does not pull that
// partition's resume point back, so an upgraded consumer does not re-read its
// topic from the start (the new table starts with the next batch; the shadow
// verdicts of events consumed before the upgrade are in decisions_raw).
var addedLater = [numTables]bool{ShadowHour: true, RolloutShadow: true, IDs: true, RegionMinute: true, RegionHour: true, RegionDay: true,
	CarryMinute: true, CarryHour: true, CarryDay: true, CarryRegionMinute: true, CarryRegionHour: true, CarryRegionDay: true}

// hasMarkers: the rollups carry a marker row per INSERT; decisions_raw and
// event_ids hold one row per event, whose highest offset is the progress.
var hasMarkers = [numTables]bool{Minute: true, Hour: true, Day: true, ShadowHour: true, RolloutShadow: true,
	RegionMinute: true, RegionHour: true, RegionDay: true,
	CarryMinute: true, CarryHour: true, CarryDay: true, CarryRegionMinute: true, CarryRegionHour: true, CarryRegionDay: true}

// byRegion: the rollups that count per region, only the events that carry
// one (a one-region deployment writes only their markers).
var byRegion = [numTables]bool{RegionMinute: true, RegionHour: true, RegionDay: true,
	CarryRegionMinute: true, CarryRegionHour: true, CarryRegionDay: true}

// String is the table's name in ClickHouse, with ":carry" for a carry
// stream.
func (t Table) String() string {
	if carried[t] {
		return tableNames[t] + ":" + CarryScope
	}
	return tableNames[t]
}

var bucketMillis = [numTables]int64{0, 60_000, 3_600_000, 86_400_000, 3_600_000, 60_000, 0, 60_000, 3_600_000, 86_400_000,
	60_000, 3_600_000, 86_400_000, 60_000, 3_600_000, 86_400_000}

// Progress is, per table (and carry stream), the highest Kafka offset of
// one partition that the table holds; -1 when it holds none.
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

// rawValues are the values of one INSERT into decisions_raw, a slice per
// column, reused from one INSERT to the next (rawPool): clickhouse-go
// copies them into its own columns, and a batch's worth is about 350 bytes
// per event that the collector would otherwise have to reclaim.
type rawValues struct {
	ids, keys, scopes, tiers, sources, policies, instances []string
	domains, shadows, regions, kinds, reservations         []string
	ts, costs, offsets, estimates, actuals, reservedTS     []uint64
	times                                                  []time.Time
	allowed, dry, warn, shadowRejected                     []uint8
	remaining, limits, actualCosts                         []int64
	parts                                                  []uint32
	traces                                                 []*string // NULL: not traced
	// Nullable: NULL when the event has none (file mode, a local
	// decision, an older event); the pointers point into nullable.
	revisions, decided, shadowRevs []*int64
	nullable                       []int64
}

var rawPool = sync.Pool{New: func() any { return new(rawValues) }}

// resize is s with length n, its values left as they were but for what
// a larger array adds.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// reset sizes v for n events. Every value is overwritten by writeRaw but
// the nullable pointers, which it sets only when not NULL: those are
// cleared.
func (v *rawValues) reset(n int) {
	for _, s := range []*[]string{&v.ids, &v.keys, &v.scopes, &v.tiers, &v.sources, &v.policies, &v.instances, &v.domains, &v.shadows, &v.regions, &v.kinds, &v.reservations} {
		*s = resize(*s, n)
	}
	for _, s := range []*[]uint64{&v.ts, &v.costs, &v.offsets, &v.estimates, &v.actuals, &v.reservedTS} {
		*s = resize(*s, n)
	}
	for _, s := range []*[]uint8{&v.allowed, &v.dry, &v.warn, &v.shadowRejected} {
		*s = resize(*s, n)
	}
	for _, s := range []*[]int64{&v.remaining, &v.limits, &v.actualCosts} {
		*s = resize(*s, n)
	}
	for _, s := range []*[]*int64{&v.revisions, &v.decided, &v.shadowRevs} {
		*s = resize(*s, n)
		clear(*s)
	}
	v.traces = resize(v.traces, n)
	clear(v.traces)
	v.times, v.parts, v.nullable = resize(v.times, n), resize(v.parts, n), resize(v.nullable, 2*n)
}

func (s *Sink) writeRaw(ctx context.Context, partition int, recs []Record) (int, error) {
	n := len(recs)
	v := rawPool.Get().(*rawValues)
	defer rawPool.Put(v)
	v.reset(n)
	var (
		ids, keys, scopes, tiers, sources, policies, instances = v.ids, v.keys, v.scopes, v.tiers, v.sources, v.policies, v.instances
		domains, shadows, regions, kinds, reservations         = v.domains, v.shadows, v.regions, v.kinds, v.reservations
		ts, costs, offsets, estimates, actuals, reservedTS     = v.ts, v.costs, v.offsets, v.estimates, v.actuals, v.reservedTS
		times                                                  = v.times
		allowed, dry, warn, shadowRejected                     = v.allowed, v.dry, v.warn, v.shadowRejected
		remaining, limits, actualCosts                         = v.remaining, v.limits, v.actualCosts
		parts                                                  = v.parts
		traces, revisions, decided, shadowRevs, nullable       = v.traces, v.revisions, v.decided, v.shadowRevs, v.nullable
	)
	var used optional // the optional columns some event of recs needs
	for i := range recs {
		used |= optionalOf(&recs[i].Event)
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
		parts[i], regions[i] = uint32(partition), e.Region
		if e.TraceID != "" {
			traces[i] = &e.TraceID
		}
		kinds[i], reservations[i], actualCosts[i] = kindOf(e), e.Reservation, actualCost(e)
		estimates[i], actuals[i], reservedTS[i] = e.Estimate, e.Actual, uint64(max(e.ReservedTS, 0))
	}
	names, values := used.columns([]any{ids, ts, times, keys, scopes, tiers, costs, allowed, sources, remaining, limits, policies, dry, warn, instances, parts, offsets, domains, shadows, shadowRejected, traces, revisions, decided, shadowRevs, regions, kinds, reservations, estimates, actuals, reservedTS, actualCosts})
	if err := s.insert(ctx, Raw, names, values); err != nil {
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
	if err := s.insert(ctx, IDs, idColumns, []any{parts, times, ids, offsets}); err != nil {
		return 0, err
	}
	return n, nil
}

type bucketKey struct {
	key, scope, tier, region string // region: "" except in usage_region_*
	start                    int64  // ms
}

type counters struct {
	requests, allowed, rejected, cost, warnings uint64
}

// rollup is the counters of a batch per (key, scope, tier, region, bucket
// start), with the buckets in the order they first appear.
type rollup struct {
	agg   map[bucketKey]*counters
	order []bucketKey
}

// aggregate counts recs into buckets of width ms; regional: per region,
// and only the events that carry one (the usage_region_* rollups);
// carried: only the events whose cost is counted in another month than
// their own (the carry streams), else only the others.
func aggregate(recs []Record, width int64, regional, carried bool) rollup {
	r := rollup{agg: make(map[bucketKey]*counters, 64)}
	for i := range recs {
		e := &recs[i].Event
		if regional && e.Region == "" || carries(e) != carried {
			continue
		}
		at := costTime(e)
		k := bucketKey{e.Key, e.Scope, e.Tier, "", at - at%width}
		if regional {
			k.region = e.Region
		}
		c := r.bucket(k)
		if e.Kind == metering.KindCorrection {
			// Signed changes, in UInt64's modular arithmetic like a
			// settle's refund: sum() of the bucket is the corrected count.
			c.requests += uint64(e.Requests)
			c.rejected += uint64(e.Rejected)
			c.allowed += uint64(e.Requests - e.Rejected)
			c.cost += e.Actual - e.Estimate
			continue
		}
		if !e.IsDecision() {
			// The actual cost: a settle adds actual − estimate in its
			// reservation's bucket, where the estimate was counted, in
			// whichever month (a refund is a subtraction, in UInt64's
			// modular arithmetic: sum() of the bucket is the actual cost,
			// never below 0); a charge adds its cost. Neither is a
			// request.
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
	return r
}

func (r *rollup) bucket(k bucketKey) *counters {
	c := r.agg[k]
	if c == nil {
		c = &counters{}
		r.agg[k] = c
		r.order = append(r.order, k)
	}
	return c
}

// widen sums r's buckets into buckets of width ms, a multiple of r's: the
// hour and day rollups from the minute one, a row per minute bucket
// instead of one per event.
func (r rollup) widen(width int64) rollup {
	w := rollup{agg: make(map[bucketKey]*counters, len(r.order))}
	for _, k := range r.order {
		c, n := r.agg[k], k
		n.start -= n.start % width
		d := w.bucket(n)
		d.requests += c.requests
		d.allowed += c.allowed
		d.rejected += c.rejected
		d.cost += c.cost
		d.warnings += c.warnings
	}
	return w
}

// writeRollup writes a rollup table's rows of recs, or a carry stream's,
// with the INSERT's marker; withCarry adds the marker of the table's carry
// stream (which then has nothing to carry).
func (s *Sink) writeRollup(ctx context.Context, t Table, partition int, r rollup, recs []Record, last int64, withCarry bool) (int, error) {
	agg, order := r.agg, r.order
	n := len(order) + 1
	if withCarry {
		n++
	}
	var (
		keys, scopes, tiers, regions                         = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		starts                                               = make([]time.Time, n)
		requests, allowed, rejected, cost, warnings, batches = make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
		parts                                                = make([]uint32, n)
		offsets                                              = make([]uint64, n)
	)
	for i, k := range order {
		c := agg[k]
		keys[i], scopes[i], tiers[i], regions[i] = k.key, k.scope, k.tier, k.region
		starts[i] = time.UnixMilli(k.start).UTC()
		requests[i], allowed[i], rejected[i], cost[i], warnings[i] = c.requests, c.allowed, c.rejected, c.cost, c.warnings
	}
	// The marker: key '' (never a rate-limit key), counters 0, batches 1,
	// in the same monthly partition as the rows so the INSERT stays
	// atomic: the events' own month, or for a carry stream the month it
	// carries into. Its scope tells the table's markers from its carry
	// stream's.
	m := len(order)
	if carried[t] {
		starts[m], scopes[m] = carryStart(recs), CarryScope
	} else {
		starts[m] = markerStart(recs, eventTime)
	}
	batches[m], parts[m], offsets[m] = 1, uint32(partition), uint64(last)
	if withCarry {
		starts[m+1], scopes[m+1] = starts[m], CarryScope
		batches[m+1], parts[m+1], offsets[m+1] = 1, uint32(partition), uint64(last)
	}
	columns := rollupColumns
	cols := []any{keys, scopes, tiers, starts, requests, allowed, rejected, cost, warnings, batches, parts, offsets}
	if byRegion[t] {
		columns, cols = columns+regionColumn, append(cols, regions)
	}
	if err := s.insert(ctx, t, columns, cols); err != nil {
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
	starts[m] = markerStart(recs, eventTime)
	batches[m], parts[m], offsets[m] = 1, uint32(partition), uint64(last)
	if err := s.insert(ctx, ShadowHour, shadowHourColumns,
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
	starts[m] = markerStart(recs, eventTime)
	batches[m], parts[m], offsets[m] = 1, uint32(partition), uint64(last)
	if err := s.insert(ctx, RolloutShadow, rolloutShadowColumns,
		[]any{rollouts, starts, decisions, newly, wouldReject, rejected, batches, parts, offsets}); err != nil {
		return 0, err
	}
	return n, nil
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

// The columns of each table's INSERT, in the order of their values.
const (
	rawColumns           = "event_id, ts, event_time, key, scope, tier, cost, allowed, source, remaining, limit_value, policy, dry_run, warning, instance, kafka_partition, kafka_offset, domain, shadow, shadow_rejected, trace_id, policy_revision, decided_us, shadow_revision, region, kind, reservation, estimate, actual, reserved_ts, actual_cost"
	idColumns            = "kafka_partition, event_time, event_id, kafka_offset"
	rollupColumns        = "key, scope, tier, start, requests, allowed, rejected, cost, warnings, batches, kafka_partition, kafka_offset"
	regionColumn         = ", region" // appended to rollupColumns in the usage_region_* rollups
	shadowHourColumns    = "shadow, key, start, decisions, would_reject, rejected, batches, kafka_partition, kafka_offset"
	rolloutShadowColumns = "rollout, start, decisions, newly_rejected, would_reject, rejected, batches, kafka_partition, kafka_offset"
)

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
