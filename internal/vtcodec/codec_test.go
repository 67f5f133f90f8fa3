//go:build vtprotobuf

package vtcodec_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewarden/ratewarden/internal/vtcodec"
)

// unknown is a field no version of these messages defines (number 999,
// varint 7): a peer's newer field must survive as protobuf-go keeps it.
var unknown = protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 7)

func withUnknown[M proto.Message](m M) M {
	m.ProtoReflect().SetUnknown(unknown)
	return m
}

// fullResponse sets every field of RateLimitResponse and of the messages
// it holds (assertAllSet checks it), with unknown fields at each level.
func fullResponse(headers int) *rlsv3.RateLimitResponse {
	hs := func(prefix string) []*corev3.HeaderValue {
		var out []*corev3.HeaderValue
		for i := 0; i < headers; i++ {
			out = append(out, withUnknown(&corev3.HeaderValue{Key: prefix + strconv.Itoa(i), Value: "v" + strconv.Itoa(i), RawValue: []byte{0, 1, 0xff}}))
		}
		return out
	}
	quota := withUnknown(&rlsv3.RateLimitResponse_Quota{Requests: 5, Id: "q1",
		ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(time.Unix(1_700_000_000, 42))}})
	meta, _ := structpb.NewStruct(map[string]any{"k": "v"})
	return withUnknown(&rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			withUnknown(&rlsv3.RateLimitResponse_DescriptorStatus{
				Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit: withUnknown(&rlsv3.RateLimitResponse_RateLimit{Name: "free", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE,
					UnitMultiplier: wrapperspb.UInt32(3)}),
				LimitRemaining:     4_000_000_000,
				DurationUntilReset: durationpb.New(1500 * time.Millisecond),
				Quota:              quota,
			}),
			{Code: rlsv3.RateLimitResponse_UNKNOWN}, // an all-default status is an empty message, still on the wire
		},
		ResponseHeadersToAdd: hs("x-ratelimit-"),
		RequestHeadersToAdd:  hs("x-req-"),
		RawBody:              []byte("over the limit"),
		DynamicMetadata:      meta,
		Quota:                quota,
	})
}

func fullRequest(entryBytes int) *rlsv3.RateLimitRequest {
	return withUnknown(&rlsv3.RateLimitRequest{
		Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{
			withUnknown(&ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					withUnknown(&ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: strings.Repeat("1", entryBytes)}),
					{Key: "path", Value: "/search"},
				},
				Limit: withUnknown(&ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_HOUR,
					UnitMultiplier: wrapperspb.UInt32(2)}),
				HitsAddend:     wrapperspb.UInt64(3),
				IsNegativeHits: true,
			}),
		},
		HitsAddend: 9,
	})
}

// assertAllSet fails unless every field of m, and of the envoy messages it
// holds, is set (a oneof: one of its members): the fixtures then cover
// every field, including ones a go-control-plane upgrade adds.
func assertAllSet(t *testing.T, m protoreflect.Message, path string) {
	t.Helper()
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
			if m.WhichOneof(o) == nil {
				t.Errorf("%s: oneof %s is not set", path, o.Name())
			}
			if m.WhichOneof(o) != fd {
				continue
			}
		}
		if !m.Has(fd) {
			t.Errorf("%s.%s is not set", path, fd.Name())
			continue
		}
		if fd.Message() == nil || !strings.HasPrefix(string(fd.Message().FullName()), "envoy.") {
			continue
		}
		v := m.Get(fd)
		if fd.IsList() {
			for j := 0; j < v.List().Len(); j++ {
				if j == 0 { // later elements may be deliberately empty
					assertAllSet(t, v.List().Get(j).Message(), path+"."+string(fd.Name())+"[0]")
				}
			}
			continue
		}
		assertAllSet(t, v.Message(), path+"."+string(fd.Name()))
	}
}

// roundTrip marshals with the codec and decodes the bytes back with the
// codec (which is proto.Unmarshal): the message must come back equal. With
// sameBytes the bytes must also be proto.Marshal's; protobuf-go writes a
// oneof after the other fields and the generated code in field order, both
// valid encodings, so a message with a oneof set is compared decoded only.
func roundTrip[M proto.Message](t *testing.T, in, out M, sameBytes bool) {
	t.Helper()
	var c vtcodec.Codec
	data, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	got := data.Materialize()
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || (sameBytes && string(got) != string(want)) {
		t.Errorf("codec bytes (%d) differ from proto.Marshal's (%d)", len(got), len(want))
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(got)}, out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, out) {
		t.Errorf("round trip changed the %T", in)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	for _, headers := range []int{1, 5, 2000} { // inline (<= 256 bytes), a plain buffer (< 1 KiB), a pooled buffer
		in := fullResponse(headers)
		assertAllSet(t, in.ProtoReflect(), "RateLimitResponse")
		t.Logf("%d headers each: %d bytes", headers, proto.Size(in))
		roundTrip(t, in, &rlsv3.RateLimitResponse{}, false)
		// Without the quota (a oneof; the service never sets it) the bytes
		// are proto.Marshal's.
		in.Quota, in.Statuses[0].Quota = nil, nil
		roundTrip(t, in, &rlsv3.RateLimitResponse{}, true)
	}
	roundTrip(t, &rlsv3.RateLimitResponse{}, &rlsv3.RateLimitResponse{}, true) // empty: zero bytes
}

func TestRequestRoundTrip(t *testing.T) {
	for _, n := range []int{1, 4096, 70_000} { // up to an entry larger than the service accepts
		in := fullRequest(n)
		assertAllSet(t, in.ProtoReflect(), "RateLimitRequest")
		out := &rlsv3.RateLimitRequest{}
		roundTrip(t, in, out, true)
		if got := out.Descriptors[0].Entries[0].Value; len(got) != n {
			t.Errorf("entry of %d bytes decoded as %d", n, len(got))
		}
	}
}

// Messages without generated code (the health service's) go through
// grpc-go's proto codec, byte for byte.
func TestOtherMessagesFallBack(t *testing.T) {
	roundTrip(t, &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, &healthpb.HealthCheckResponse{}, true)
	if _, err := (vtcodec.Codec{}).Marshal("not a message"); err == nil {
		t.Error("marshaling a string: no error")
	}
}

// usualAnswer is the service's answer to one descriptor: one status and
// the six RateLimit headers.
func usualAnswer() *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "bulk", RequestsPerUnit: 1000000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
		LimitRemaining: 999999, DurationUntilReset: durationpb.New(time.Millisecond)}}}
	for _, k := range []string{"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: "1000000"})
	}
	return resp
}

// A one-descriptor answer costs one allocation to marshal (grpc-go's codec
// makes three): an allocation count, not a time.
func TestMarshalAllocations(t *testing.T) {
	resp := usualAnswer()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := (vtcodec.Codec{}).Marshal(resp); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("%.1f allocations per marshal, want 1", allocs)
	}
	if !vtcodec.Enabled {
		t.Error("built with the vtprotobuf tag, Enabled is false")
	}
}

// BenchmarkMarshal compares grpc-go's proto codec with this one on the
// service's usual answer.
func BenchmarkMarshal(b *testing.B) {
	resp := usualAnswer()
	for _, c := range []encoding.CodecV2{encoding.GetCodecV2("proto"), vtcodec.Codec{}} {
		b.Run(fmt.Sprintf("%T", c), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				data, err := c.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}
