package metering

import (
	"strconv"

	"github.com/ratewarden/ratewarden/internal/jsonstr"
)

// AppendEncode appends the version-1 JSON encoding of e to dst and returns
// the extended slice. The bytes are identical to Encode's (field order,
// escaping), without reflection or allocation beyond growing dst; the
// emitter uses it on its hot path.
func (e *Event) AppendEncode(dst []byte) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, EventVersion, 10)
	dst = append(dst, `,"event_id":`...)
	dst = jsonstr.Append(dst, e.EventID)
	dst = append(dst, `,"ts":`...)
	dst = strconv.AppendInt(dst, e.TS, 10)
	dst = append(dst, `,"key":`...)
	dst = jsonstr.Append(dst, e.Key)
	dst = append(dst, `,"scope":`...)
	dst = jsonstr.Append(dst, e.Scope)
	dst = append(dst, `,"tier":`...)
	dst = jsonstr.Append(dst, e.Tier)
	dst = append(dst, `,"cost":`...)
	dst = strconv.AppendUint(dst, e.Cost, 10)
	dst = append(dst, `,"allowed":`...)
	dst = strconv.AppendBool(dst, e.Allowed)
	dst = append(dst, `,"source":`...)
	dst = jsonstr.Append(dst, e.Source)
	dst = append(dst, `,"remaining":`...)
	dst = strconv.AppendInt(dst, e.Remaining, 10)
	dst = append(dst, `,"limit":`...)
	dst = strconv.AppendInt(dst, e.Limit, 10)
	dst = append(dst, `,"policy":`...)
	dst = jsonstr.Append(dst, e.Policy)
	dst = append(dst, `,"dry_run":`...)
	dst = strconv.AppendBool(dst, e.DryRun)
	dst = append(dst, `,"warning":`...)
	dst = strconv.AppendBool(dst, e.Warning)
	dst = append(dst, `,"instance":`...)
	dst = jsonstr.Append(dst, e.Instance)
	return append(e.appendOptional(dst), '}')
}

// appendOptional writes the members that are omitempty in Encode, each
// only when set, in the Event struct's field order (Encode's order).
func (e *Event) appendOptional(dst []byte) []byte {
	if e.Domain != "" {
		dst = append(dst, `,"domain":`...)
		dst = jsonstr.Append(dst, e.Domain)
	}
	if e.Shadow != "" {
		dst = append(dst, `,"shadow":`...)
		dst = jsonstr.Append(dst, e.Shadow)
	}
	if e.ShadowRejected {
		dst = append(dst, `,"shadow_rejected":true`...)
	}
	if e.PolicyRevision != 0 {
		dst = append(dst, `,"policy_revision":`...)
		dst = strconv.AppendInt(dst, e.PolicyRevision, 10)
	}
	if e.TraceID != "" {
		dst = append(dst, `,"trace_id":`...)
		dst = jsonstr.Append(dst, e.TraceID)
	}
	if e.DecidedUS != 0 {
		dst = append(dst, `,"decided_us":`...)
		dst = strconv.AppendInt(dst, e.DecidedUS, 10)
	}
	if e.ShadowRevision != 0 {
		dst = append(dst, `,"shadow_revision":`...)
		dst = strconv.AppendInt(dst, e.ShadowRevision, 10)
	}
	if e.Kind != "" {
		dst = append(dst, `,"kind":`...)
		dst = jsonstr.Append(dst, e.Kind)
	}
	if e.Reservation != "" {
		dst = append(dst, `,"reservation":`...)
		dst = jsonstr.Append(dst, e.Reservation)
	}
	if e.Estimate != 0 {
		dst = append(dst, `,"estimate":`...)
		dst = strconv.AppendUint(dst, e.Estimate, 10)
	}
	if e.Actual != 0 {
		dst = append(dst, `,"actual":`...)
		dst = strconv.AppendUint(dst, e.Actual, 10)
	}
	if e.ReservedTS != 0 {
		dst = append(dst, `,"reserved_ts":`...)
		dst = strconv.AppendInt(dst, e.ReservedTS, 10)
	}
	if e.Region != "" {
		dst = append(dst, `,"region":`...)
		dst = jsonstr.Append(dst, e.Region)
	}
	if e.Requests != 0 {
		dst = append(dst, `,"requests":`...)
		dst = strconv.AppendInt(dst, e.Requests, 10)
	}
	if e.Rejected != 0 {
		dst = append(dst, `,"rejected":`...)
		dst = strconv.AppendInt(dst, e.Rejected, 10)
	}
	if e.Slot != "" {
		dst = append(dst, `,"slot":`...)
		dst = jsonstr.Append(dst, e.Slot)
	}
	if e.Priority != "" {
		dst = append(dst, `,"priority":`...)
		dst = jsonstr.Append(dst, e.Priority)
	}
	if e.InFlight != 0 {
		dst = append(dst, `,"in_flight":`...)
		dst = strconv.AppendInt(dst, e.InFlight, 10)
	}
	return dst
}
