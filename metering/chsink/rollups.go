package chsink

import (
	"context"
	"time"

	"github.com/ratewarden/ratewarden/metering"
)

// The rollups' rows: usage per key and bucket (and per region), shadow
// verdicts per rule and hour, and per rollout and minute, each INSERT with
// its marker row.

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
		if e.Kind == metering.KindSlot {
			continue // no request and no cost: slots_minute counts it
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
