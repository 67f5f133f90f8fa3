//go:build vtprotobuf

package vtcodec

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Enabled reports whether the binary was built with the vtprotobuf tag.
const Enabled = true

// ServerOptions makes a gRPC server use Codec for every call.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(Codec{})}
}

// vtMessage is what protoc-gen-go-vtproto generates for a message (with
// the "marshal_strict" feature that go-control-plane uses): its size, and
// marshaling into a buffer of exactly that size, back to front.
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict([]byte) (int, error)
}

// inlineBytes is the size up to which a marshaled message shares one
// allocation with the buffer list grpc-go wants (a RateLimitResponse with
// one descriptor and its headers is about 200 bytes).
const inlineBytes = 256

// Codec is an encoding.CodecV2 named "proto" (the wire format is
// unchanged: it is what application/grpc means).
type Codec struct{}

// proto is grpc-go's own codec, for what Codec does not do itself.
func proto() encoding.CodecV2 { return encoding.GetCodecV2(protoenc.Name) }

// small is a marshaled message of at most inlineBytes and the one-buffer
// list that holds it: one allocation, where grpc-go's codec makes three
// (the bytes, the interface value, the list).
type small struct {
	list [1]mem.Buffer
	sb   mem.SliceBuffer
	arr  [inlineBytes]byte
}

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return proto().Marshal(v)
	}
	size := m.SizeVT()
	if size <= inlineBytes {
		s := &small{}
		n, err := m.MarshalToSizedBufferVTStrict(s.arr[:size])
		if err != nil {
			return nil, fmt.Errorf("vtcodec: marshal %T: %w", v, err)
		}
		s.sb = s.arr[size-n : size]
		s.list[0] = &s.sb
		return s.list[:], nil
	}
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		n, err := m.MarshalToSizedBufferVTStrict(buf)
		if err != nil {
			return nil, fmt.Errorf("vtcodec: marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(buf[size-n:])}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	n, err := m.MarshalToSizedBufferVTStrict((*buf)[:size])
	if err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("vtcodec: marshal %T: %w", v, err)
	}
	if n != size {
		// Never with generated code (SizeVT is exact); kept correct anyway.
		copy((*buf)[:n], (*buf)[size-n:size])
	}
	*buf = (*buf)[:n]
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal implements encoding.CodecV2: grpc-go's proto codec (there is
// no generated unmarshaler to use).
func (Codec) Unmarshal(data mem.BufferSlice, v any) error { return proto().Unmarshal(data, v) }

// Name implements encoding.CodecV2.
func (Codec) Name() string { return protoenc.Name }
