package chsink

import (
	"slices"
	"strings"

	"github.com/ratewarden/ratewarden/metering"
)

// Most events leave most of decisions_raw's later columns empty: no Envoy
// domain, shadow verdict, trace, region or reservation, and a decision's
// kind and actual cost follow from its other fields. Each such column has
// a DEFAULT in schema/ that fills in exactly the value the sink would send
// for an event that does not use it, so an INSERT leaves out every one
// that no event of its batch uses: fewer columns to build, send and parse,
// for the sink and for ClickHouse alike. TestOmittedColumnsAreTheirDefaults
// checks each default against the schema.

// optional is a set of decisions_raw's optional columns, one bit each.
type optional uint32

// optionalColumns are the optional columns, by bit, and what an event
// that needs each one carries: a value other than its DEFAULT.
var optionalColumns = []struct {
	name string
	used func(e *metering.Event) bool
}{
	{"domain", func(e *metering.Event) bool { return e.Domain != "" }},
	{"shadow", func(e *metering.Event) bool { return e.Shadow != "" }},
	{"shadow_rejected", func(e *metering.Event) bool { return e.ShadowRejected }},
	{"trace_id", func(e *metering.Event) bool { return e.TraceID != "" }},              // NULL
	{"policy_revision", func(e *metering.Event) bool { return e.PolicyRevision != 0 }}, // NULL
	{"decided_us", func(e *metering.Event) bool { return e.DecidedUS != 0 }},           // NULL
	{"shadow_revision", func(e *metering.Event) bool { return e.ShadowRevision != 0 }}, // NULL
	{"region", func(e *metering.Event) bool { return e.Region != "" }},
	// DEFAULT 'decision', and actual_cost's DEFAULT is a decision's:
	// the cost if allowed, else 0 (actualCost).
	{"kind", func(e *metering.Event) bool { return !e.IsDecision() }},
	{"reservation", func(e *metering.Event) bool { return e.Reservation != "" }},
	{"estimate", func(e *metering.Event) bool { return e.Estimate != 0 }},
	{"actual", func(e *metering.Event) bool { return e.Actual != 0 }},
	{"reserved_ts", func(e *metering.Event) bool { return e.ReservedTS > 0 }},
	{"actual_cost", func(e *metering.Event) bool { return !e.IsDecision() }},
	{"slot", func(e *metering.Event) bool { return e.Slot != "" }},
	{"priority", func(e *metering.Event) bool { return e.Priority != "" }},
	{"in_flight", func(e *metering.Event) bool { return e.InFlight > 0 }},
}

// rawNames are rawColumns one by one, and optionalBit the bit of each
// optional one (0 for a column every INSERT sends).
var rawNames, optionalBit = func() ([]string, []optional) {
	names := strings.Split(rawColumns, ", ")
	bits := make([]optional, len(names))
	for b, c := range optionalColumns {
		i := slices.Index(names, c.name)
		if i < 0 {
			panic("chsink: optional column " + c.name + " is not in rawColumns")
		}
		bits[i] = 1 << b
	}
	return names, bits
}()

// optionalOf is the optional columns e needs.
func optionalOf(e *metering.Event) optional {
	var o optional
	for b, c := range optionalColumns {
		if c.used(e) {
			o |= 1 << b
		}
	}
	return o
}

// columns is the column list of an INSERT into decisions_raw and its
// values, of values (one per rawColumns) those that o does not leave out.
func (o optional) columns(values []any) (string, []any) {
	if o == 1<<len(optionalColumns)-1 {
		return rawColumns, values
	}
	var names strings.Builder
	kept := values[:0]
	for i, v := range values {
		if b := optionalBit[i]; b != 0 && o&b == 0 {
			continue
		}
		if names.Len() > 0 {
			names.WriteString(", ")
		}
		names.WriteString(rawNames[i])
		kept = append(kept, v)
	}
	return names.String(), kept
}
