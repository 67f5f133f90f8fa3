package metering

import (
	"bytes"
	"testing"
)

// Every optional member (omitempty in Encode) is absent when zero, so old
// bytes stay unchanged; when present, alone or all together, AppendEncode
// writes exactly Encode's bytes (the same order) and both decoders read
// it back.
func TestOptionalMembersAreBackwardCompatible(t *testing.T) {
	base := sample()
	plain := base.AppendEncode(nil)
	all := sample()
	all.Domain, all.Shadow, all.ShadowRejected = "edge", "trial", true
	all.PolicyRevision, all.TraceID, all.DecidedUS, all.ShadowRevision = 7, "4bf92f3577b34da6a3ce929d0e0e4736", 1_767_225_600_123_456, 9
	cases := map[string]func(*Event){
		"domain":          func(e *Event) { e.Domain = all.Domain },
		"shadow":          func(e *Event) { e.Shadow, e.ShadowRejected = all.Shadow, true },
		"policy_revision": func(e *Event) { e.PolicyRevision = all.PolicyRevision },
		"trace_id":        func(e *Event) { e.TraceID = all.TraceID },
		"decided_us":      func(e *Event) { e.DecidedUS = all.DecidedUS },
		"shadow_revision": func(e *Event) { e.ShadowRevision = all.ShadowRevision },
		"all":             func(e *Event) { *e = all },
	}
	for name, set := range cases {
		if name != "all" && bytes.Contains(plain, []byte(`"`+name+`"`)) {
			t.Errorf("an event without %s mentions it: %s", name, plain)
		}
		e := sample()
		set(&e)
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got := e.AppendEncode(nil)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: AppendEncode:\n got %s\nwant %s", name, got, want)
		}
		var dec Decoder
		if fast, err := dec.Decode(got); err != nil || fast != e {
			t.Errorf("%s: Decoder: %+v %v, want %+v", name, fast, err, e)
		}
		if slow, err := Decode(got); err != nil || slow != e {
			t.Errorf("%s: Decode: %+v %v, want %+v", name, slow, err, e)
		}
	}
}
