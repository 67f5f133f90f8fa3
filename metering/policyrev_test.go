package metering

import (
	"bytes"
	"testing"
)

// policy_revision rides in version 1: absent in file mode (old bytes
// unchanged), and read back by both decoders when present.
func TestPolicyRevisionIsBackwardCompatible(t *testing.T) {
	plain := sample()
	if b := plain.AppendEncode(nil); bytes.Contains(b, []byte("policy_revision")) {
		t.Fatalf("an event without a revision mentions it: %s", b)
	}
	e := sample()
	e.PolicyRevision = 42
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got := e.AppendEncode(nil)
	if !bytes.Equal(got, want) || !bytes.Contains(got, []byte(`"policy_revision":42`)) {
		t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
	}
	var dec Decoder
	if fast, err := dec.Decode(got); err != nil || fast != e {
		t.Fatalf("Decoder: %+v %v, want %+v", fast, err, e)
	}
	if slow, err := Decode(got); err != nil || slow != e {
		t.Fatalf("Decode: %+v %v, want %+v", slow, err, e)
	}
}

// decided_us rides in version 1 like policy_revision: absent for a local
// decision (old bytes unchanged), read back by both decoders when present,
// in the order encoding/json writes it.
func TestDecidedInstantIsBackwardCompatible(t *testing.T) {
	plain := sample()
	if b := plain.AppendEncode(nil); bytes.Contains(b, []byte("decided_us")) {
		t.Fatalf("an event without the instant mentions it: %s", b)
	}
	e := sample()
	e.PolicyRevision = 7
	e.DecidedUS = 1_767_225_600_123_456
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got := e.AppendEncode(nil)
	if !bytes.Equal(got, want) || !bytes.Contains(got, []byte(`"decided_us":1767225600123456`)) {
		t.Fatalf("AppendEncode:\n got %s\nwant %s", got, want)
	}
	var dec Decoder
	if fast, err := dec.Decode(got); err != nil || fast != e {
		t.Fatalf("Decoder: %+v %v, want %+v", fast, err, e)
	}
	if slow, err := Decode(got); err != nil || slow != e {
		t.Fatalf("Decode: %+v %v, want %+v", slow, err, e)
	}
}
