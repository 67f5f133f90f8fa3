package main

import (
	"context"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// registerRLS serves the Envoy rate limit service as go-control-plane's
// RegisterRateLimitServiceServer does (same service, method, types and
// descriptor file, so reflection and clients see no difference), with a
// method handler that allocates nothing of its own per call. The
// generated handler allocates the request, the UnaryServerInfo and a
// closure for the interceptor on every call; here the request comes from
// a pool and the other two are made once (what the server still allocates
// is grpc-go's own stream setup, header decoding and the request's
// reflection decoding).
func registerRLS(s *grpc.Server, impl rlsv3.RateLimitServiceServer) {
	h := &rlsHandler{impl: impl}
	h.info = &grpc.UnaryServerInfo{Server: impl, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	h.call = func(ctx context.Context, req any) (any, error) {
		return impl.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	}
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
		HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: h.handle}},
		Metadata:    rlsv3.RateLimitService_ServiceDesc.Metadata,
	}, impl)
}

type rlsHandler struct {
	impl rlsv3.RateLimitServiceServer
	info *grpc.UnaryServerInfo
	call grpc.UnaryHandler
}

// rlsRequests recycles decoded requests. A request is the handler's only
// until it returns: grpc-go does not keep it (the answer is marshaled from
// the response), the interceptor and the service use it during the call
// only, and what outlives the call (metering events, hot-key names) holds
// strings, which decoding copies out of the message rather than aliasing
// it. Decoding resets the message first (proto.Unmarshal without Merge).
var rlsRequests = sync.Pool{New: func() any { return new(rlsv3.RateLimitRequest) }}

func (h *rlsHandler) handle(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := rlsRequests.Get().(*rlsv3.RateLimitRequest)
	defer rlsRequests.Put(in)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return h.impl.ShouldRateLimit(ctx, in)
	}
	return interceptor(ctx, in, h.info, h.call)
}
