package metering

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// AppendEncode appends the version-1 JSON encoding of e to dst and returns
// the extended slice. The bytes are identical to Encode's (field order,
// escaping), without reflection or allocation beyond growing dst; the
// emitter uses it on its hot path.
func (e *Event) AppendEncode(dst []byte) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, EventVersion, 10)
	dst = append(dst, `,"event_id":`...)
	dst = appendString(dst, e.EventID)
	dst = append(dst, `,"ts":`...)
	dst = strconv.AppendInt(dst, e.TS, 10)
	dst = append(dst, `,"key":`...)
	dst = appendString(dst, e.Key)
	dst = append(dst, `,"scope":`...)
	dst = appendString(dst, e.Scope)
	dst = append(dst, `,"tier":`...)
	dst = appendString(dst, e.Tier)
	dst = append(dst, `,"cost":`...)
	dst = strconv.AppendUint(dst, e.Cost, 10)
	dst = append(dst, `,"allowed":`...)
	dst = strconv.AppendBool(dst, e.Allowed)
	dst = append(dst, `,"source":`...)
	dst = appendString(dst, e.Source)
	dst = append(dst, `,"remaining":`...)
	dst = strconv.AppendInt(dst, e.Remaining, 10)
	dst = append(dst, `,"limit":`...)
	dst = strconv.AppendInt(dst, e.Limit, 10)
	dst = append(dst, `,"policy":`...)
	dst = appendString(dst, e.Policy)
	dst = append(dst, `,"dry_run":`...)
	dst = strconv.AppendBool(dst, e.DryRun)
	dst = append(dst, `,"warning":`...)
	dst = strconv.AppendBool(dst, e.Warning)
	dst = append(dst, `,"instance":`...)
	dst = appendString(dst, e.Instance)
	dst = e.appendShadow(dst)
	if e.TraceID != "" {
		dst = append(dst, `,"trace_id":`...)
		dst = appendString(dst, e.TraceID)
	}
	return append(dst, '}')
}

// appendString writes s as a JSON string exactly as encoding/json does:
// plain printable ASCII is copied; anything else (quotes, backslashes,
// control bytes, <, >, &, non-ASCII) goes through encoding/json.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always marshals
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// appendShadow writes the shadow verdict's members, present only when a
// shadow limit was evaluated (omitempty in Encode).
func (e *Event) appendShadow(dst []byte) []byte {
	if e.Shadow != "" {
		dst = append(dst, `,"shadow":`...)
		dst = appendString(dst, e.Shadow)
	}
	if e.ShadowRejected {
		dst = append(dst, `,"shadow_rejected":true`...)
	}
	return dst
}
