package chsink

import (
	"context"
	"sync"
	"time"
)

// The rows of one event each: decisions_raw and event_ids.

// rawValues are the values of one INSERT into decisions_raw, a slice per
// column, reused from one INSERT to the next (rawPool): clickhouse-go
// copies them into its own columns, and a batch's worth is about 350 bytes
// per event that the collector would otherwise have to reclaim.
type rawValues struct {
	ids, keys, scopes, tiers, sources, policies, instances []string
	domains, shadows, regions, kinds, reservations         []string
	slots, priorities                                      []string
	ts, costs, offsets, estimates, actuals, reservedTS     []uint64
	inFlight                                               []uint64
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
	for _, s := range []*[]string{&v.ids, &v.keys, &v.scopes, &v.tiers, &v.sources, &v.policies, &v.instances, &v.domains, &v.shadows, &v.regions, &v.kinds, &v.reservations, &v.slots, &v.priorities} {
		*s = resize(*s, n)
	}
	for _, s := range []*[]uint64{&v.ts, &v.costs, &v.offsets, &v.estimates, &v.actuals, &v.reservedTS, &v.inFlight} {
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
		slots, priorities, inFlight                            = v.slots, v.priorities, v.inFlight
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
		slots[i], priorities[i], inFlight[i] = e.Slot, e.Priority, uint64(max(e.InFlight, 0))
	}
	names, values := used.columns([]any{ids, ts, times, keys, scopes, tiers, costs, allowed, sources, remaining, limits, policies, dry, warn, instances, parts, offsets, domains, shadows, shadowRejected, traces, revisions, decided, shadowRevs, regions, kinds, reservations, estimates, actuals, reservedTS, actualCosts, slots, priorities, inFlight})
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
