package chsink

import (
	"context"
	"time"

	"github.com/ratewarden/ratewarden/metering"
)

// slotKey is one row of slots_minute.
type slotKey struct {
	key, scope, region, priority string
	start                        int64 // ms
}

// slotCounters are a slots_minute row's values: the slots taken, refused,
// shed and released, and the most slots held after any slot decision.
type slotCounters struct {
	taken, refused, shed, released, peak uint64
}

// aggregateSlots counts the slot events of recs per key, scope, region,
// priority class and minute, in the order the rows first appear.
func aggregateSlots(recs []Record) (map[slotKey]*slotCounters, []slotKey) {
	width := bucketMillis[SlotsMinute]
	agg := make(map[slotKey]*slotCounters)
	var order []slotKey
	for i := range recs {
		e := &recs[i].Event
		if e.Slot == "" {
			continue
		}
		k := slotKey{e.Key, e.Scope, e.Region, e.Priority, e.TS - e.TS%width}
		c := agg[k]
		if c == nil {
			c = &slotCounters{}
			agg[k] = c
			order = append(order, k)
		}
		switch e.Slot {
		case metering.SlotTaken:
			c.taken++
		case metering.SlotRefused:
			c.refused++
		case metering.SlotShed:
			c.shed++
		case metering.SlotReleased:
			c.released++
		}
		c.peak = max(c.peak, uint64(max(e.InFlight, 0)))
	}
	return agg, order
}

// writeSlots writes the slot decisions of recs into slots_minute with the
// batch's marker (also when no event was a slot decision). A replayed
// batch is never written twice (the marker's offset is the table's
// progress), so the counts are exact; the peak is a maximum, which a
// duplicate could not change anyway.
func (s *Sink) writeSlots(ctx context.Context, partition int, recs []Record, last int64) (int, error) {
	agg, order := aggregateSlots(recs)
	n := len(order) + 1
	var (
		keys, scopes, regions, priorities                     = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		starts                                                = make([]time.Time, n)
		taken, refused, shed, released, peak, batches, offset = make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
		parts                                                 = make([]uint32, n)
	)
	for i, k := range order {
		c := agg[k]
		keys[i], scopes[i], regions[i], priorities[i] = k.key, k.scope, k.region, k.priority
		starts[i] = time.UnixMilli(k.start).UTC()
		taken[i], refused[i], shed[i], released[i], peak[i] = c.taken, c.refused, c.shed, c.released, c.peak
	}
	// The marker: key '' and scope '', in the batch's own month.
	m := n - 1
	starts[m] = markerStart(recs, eventTime)
	batches[m], parts[m], offset[m] = 1, uint32(partition), uint64(last)
	if err := s.insert(ctx, SlotsMinute, slotsColumns,
		[]any{keys, scopes, regions, priorities, starts, taken, refused, shed, released, peak, batches, parts, offset}); err != nil {
		return 0, err
	}
	return n, nil
}
