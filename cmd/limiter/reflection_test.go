package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
)

// TestEnvoyRLSThroughReflection: a client that knows nothing of the API but
// what the server's reflection tells it (as grpcurl works: list, describe,
// then a request written as JSON and encoded from the reflected schema)
// lists the services, finds ShouldRateLimit and gets a decision.
// Reflection needs the token; health does not.
func TestEnvoyRLSThroughReflection(t *testing.T) {
	_, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, "LIMITER_AUTH_TOKEN=tok")
	conn := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok")

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(authed)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatalf("reflection send: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection: %v", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection error: %s", e.GetErrorMessage())
		}
		return resp
	}

	var services []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}).GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Fatalf("reflection lists %v, not %s", services, want)
		}
	}

	// The file that holds the service, with every file it imports.
	set := &descriptorpb.FileDescriptorSet{}
	for _, raw := range ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
			FileContainingSymbol: "envoy.service.ratelimit.v3.RateLimitService"},
	}).GetFileDescriptorResponse().GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			t.Fatal(err)
		}
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("reflected files do not form a schema: %v", err)
	}
	d, err := files.FindDescriptorByName("envoy.service.ratelimit.v3.RateLimitService")
	if err != nil {
		t.Fatal(err)
	}
	method := d.(protoreflect.ServiceDescriptor).Methods().ByName("ShouldRateLimit")
	if method == nil || method.Input().FullName() != "envoy.service.ratelimit.v3.RateLimitRequest" ||
		method.Output().FullName() != "envoy.service.ratelimit.v3.RateLimitResponse" {
		t.Fatalf("reflected ShouldRateLimit: %v", method)
	}

	req := dynamicpb.NewMessage(method.Input())
	if err := protojson.Unmarshal([]byte(`{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "203.0.113.7"}]}], "hits_addend": 2}`), req); err != nil {
		t.Fatal(err)
	}
	reply := dynamicpb.NewMessage(method.Output())
	if err := conn.Invoke(authed, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", req, reply); err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	out, err := protojson.Marshal(reply)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			Code           string `json:"code"`
			LimitRemaining int    `json:"limitRemaining"`
			CurrentLimit   struct {
				Name            string `json:"name"`
				RequestsPerUnit int    `json:"requestsPerUnit"`
				Unit            string `json:"unit"`
			} `json:"currentLimit"`
		} `json:"statuses"`
		Headers []struct{ Key, Value string } `json:"responseHeadersToAdd"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if resp.OverallCode != "OK" || len(resp.Statuses) != 1 || resp.Statuses[0].LimitRemaining != 1 ||
		resp.Statuses[0].CurrentLimit.Name != "anonymous" || resp.Statuses[0].CurrentLimit.Unit != "MINUTE" || len(resp.Headers) != 6 {
		t.Errorf("ShouldRateLimit:\n%s", out)
	}

	// Without the token: reflection is refused.
	bare, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err == nil {
		// Send answers io.EOF when the server has already ended the
		// stream (it refused it at once); Recv then gives the status.
		if err = bare.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err == nil || errors.Is(err, io.EOF) {
			_, err = bare.Recv()
		}
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("reflection without the token: %v, want Unauthenticated", err)
	}
	// Health needs no token.
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without the token: %v %v", h, err)
	}
}
