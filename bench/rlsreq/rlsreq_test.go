package rlsreq

import (
	"encoding/binary"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// OverallCode agrees with a full proto.Unmarshal, whatever surrounds the
// field, and rejects a truncated message.
func TestOverallCode(t *testing.T) {
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_UNKNOWN, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp := &rlsv3.RateLimitResponse{
			OverallCode:          want,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-ratelimit-limit", Value: "10"}},
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var full rlsv3.RateLimitResponse
		if err := proto.Unmarshal(b, &full); err != nil {
			t.Fatal(err)
		}
		got, err := OverallCode(b)
		if err != nil || got != want || got != full.OverallCode {
			t.Fatalf("OverallCode = %v, %v; want %v (proto.Unmarshal: %v)", got, err, want, full.OverallCode)
		}
		if len(b) > 1 {
			if _, err := OverallCode(b[:len(b)-1]); err == nil {
				t.Fatalf("a truncated %v answer decoded without an error", want)
			}
		}
	}
}

// Frame puts the 5-byte gRPC header before the message, and Requests make
// distinct descriptors unless same.
func TestFrameAndRequests(t *testing.T) {
	reqs := Requests(3, "bench", "acct_", false)
	if v := reqs[2].Descriptors[0].Entries[0].Value; v != "acct_3" {
		t.Fatalf("third value %q, want acct_3", v)
	}
	if v := Requests(2, "bench", "flood", true)[1].Descriptors[0].Entries[0].Value; v != "flood" {
		t.Fatalf("same: value %q, want flood", v)
	}
	f, err := Frame(reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	var back rlsv3.RateLimitRequest
	if f[0] != 0 || int(binary.BigEndian.Uint32(f[1:5])) != len(f)-5 || proto.Unmarshal(f[5:], &back) != nil || !proto.Equal(&back, reqs[0]) {
		t.Fatalf("frame %x does not hold the request", f)
	}
}
