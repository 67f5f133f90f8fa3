// Package rlsreq is the bench's Envoy rate limit service traffic, in one
// place for the load tools that send it: the RateLimitRequests
// (go-control-plane types, domain bench, one descriptor [{key, <value>}],
// as bench/envoy-policy.yaml expects), their gRPC framing, and the
// overall code read back from a RateLimitResponse.
package rlsreq

import (
	"encoding/binary"
	"fmt"
	"strconv"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Method is the gRPC method (the HTTP/2 :path) the requests are for.
const Method = rlsv3.RateLimitService_ShouldRateLimit_FullMethodName

// Requests are n RateLimitRequests of domain, each with the descriptor
// [{key, value<i>}] for i = 1..n, or [{key, value}] n times when same.
func Requests(n int, domain, value string, same bool) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		v := value
		if !same {
			v = value + strconv.Itoa(i+1)
		}
		out[i] = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: v}},
		}}}
	}
	return out
}

// Frame is m as the body of a unary gRPC call: the 5-byte message header
// (not compressed, big-endian length) and the marshaled message.
func Frame(m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...), nil
}

// Frames frames every request.
func Frames(reqs []*rlsv3.RateLimitRequest) ([][]byte, error) {
	out := make([][]byte, len(reqs))
	for i, r := range reqs {
		b, err := Frame(r)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// overallCodeField is RateLimitResponse.overall_code's field number, from
// the generated descriptor rather than written down here.
var overallCodeField = (&rlsv3.RateLimitResponse{}).ProtoReflect().Descriptor().Fields().ByName("overall_code").Number()

// OverallCode reads a marshaled RateLimitResponse's overall_code. It walks
// every top-level field (a malformed message is an error) but decodes only
// that one, so a load tool reading every answer spends little on it: a
// full proto.Unmarshal would build the descriptor statuses and headers it
// does not look at. The last occurrence wins, as in protobuf; absent is
// UNKNOWN (the zero value).
func OverallCode(msg []byte) (rlsv3.RateLimitResponse_Code, error) {
	code := rlsv3.RateLimitResponse_UNKNOWN
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, fmt.Errorf("RateLimitResponse: %w", protowire.ParseError(n))
		}
		msg = msg[n:]
		if num == overallCodeField && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(msg)
			if m < 0 {
				return 0, fmt.Errorf("RateLimitResponse overall_code: %w", protowire.ParseError(m))
			}
			code = rlsv3.RateLimitResponse_Code(int32(v))
			msg = msg[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, msg)
		if m < 0 {
			return 0, fmt.Errorf("RateLimitResponse field %d: %w", num, protowire.ParseError(m))
		}
		msg = msg[m:]
	}
	return code, nil
}

// Outcomes are the names Classify sorts answers into.
var Outcomes = []string{"ok", "over_limit", "other_code"}

// Classify sorts a RateLimitResponse by its overall code into Outcomes.
func Classify(msg []byte) (int, error) {
	code, err := OverallCode(msg)
	switch {
	case err != nil:
		return 0, err
	case code == rlsv3.RateLimitResponse_OK:
		return 0, nil
	case code == rlsv3.RateLimitResponse_OVER_LIMIT:
		return 1, nil
	}
	return 2, nil
}
