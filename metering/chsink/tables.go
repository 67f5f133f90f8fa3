package chsink

import "github.com/ratewarden/ratewarden/schema"

// The catalogue of what the sink writes: its tables and carry streams,
// what each holds (markers, regions, its bucket's width), its columns, and
// the progress a partition has made in each.

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
	// SlotsMinute is slots_minute: the slot decisions per key, scope,
	// region, priority class and minute (writeSlots).
	SlotsMinute
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
	schema.UsageRegionMinute, schema.UsageRegionHour, schema.UsageRegionDay, schema.SlotsMinute,
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
var addedLater = [numTables]bool{ShadowHour: true, RolloutShadow: true, IDs: true, RegionMinute: true, RegionHour: true, RegionDay: true, SlotsMinute: true,
	CarryMinute: true, CarryHour: true, CarryDay: true, CarryRegionMinute: true, CarryRegionHour: true, CarryRegionDay: true}

// hasMarkers: the rollups carry a marker row per INSERT; decisions_raw and
// event_ids hold one row per event, whose highest offset is the progress.
var hasMarkers = [numTables]bool{Minute: true, Hour: true, Day: true, ShadowHour: true, RolloutShadow: true,
	RegionMinute: true, RegionHour: true, RegionDay: true, SlotsMinute: true,
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

var bucketMillis = [numTables]int64{0, 60_000, 3_600_000, 86_400_000, 3_600_000, 60_000, 0, 60_000, 3_600_000, 86_400_000, 60_000,
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

// The columns of each table's INSERT, in the order of their values.
const (
	rawColumns           = "event_id, ts, event_time, key, scope, tier, cost, allowed, source, remaining, limit_value, policy, dry_run, warning, instance, kafka_partition, kafka_offset, domain, shadow, shadow_rejected, trace_id, policy_revision, decided_us, shadow_revision, region, kind, reservation, estimate, actual, reserved_ts, actual_cost, slot, priority, in_flight"
	idColumns            = "kafka_partition, event_time, event_id, kafka_offset"
	rollupColumns        = "key, scope, tier, start, requests, allowed, rejected, cost, warnings, batches, kafka_partition, kafka_offset"
	regionColumn         = ", region" // appended to rollupColumns in the usage_region_* rollups
	shadowHourColumns    = "shadow, key, start, decisions, would_reject, rejected, batches, kafka_partition, kafka_offset"
	slotsColumns         = "key, scope, region, priority, start, taken, refused, shed, released, peak_in_flight, batches, kafka_partition, kafka_offset"
	rolloutShadowColumns = "rollout, start, decisions, newly_rejected, would_reject, rejected, batches, kafka_partition, kafka_offset"
)
