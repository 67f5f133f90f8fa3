package envoyrls

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/slots"
)

// The names the door and Envoy's configuration share to take and give
// back concurrency slots (docs/concurrency.md, "The Envoy door").
const (
	// PriorityEntryKey is a descriptor entry naming the request's priority
	// class (as /check's "priority"); without it the class is default. It
	// is not mapped.
	PriorityEntryKey = "ratewarden.priority"
	// LeaseMetadataKey is the field of an OK answer's dynamic_metadata
	// that lists the leases the call took, comma-separated (lease ids are
	// base64url: no comma in them).
	LeaseMetadataKey = "ratewarden.lease"
	// ReasonMetadataKey is the field of an OVER_LIMIT answer's
	// dynamic_metadata saying why, when the reason is a slot's:
	// "concurrency" or "shed" (for access logs; Envoy answers 429 either way).
	ReasonMetadataKey = "ratewarden.reason"
	// ReleaseEntryKey marks a descriptor as a release, sent when the
	// stream is done: its value is LeaseMetadataKey's, read back from the
	// dynamic metadata. Each lease listed is given back (one that holds no
	// slot, released before or expired, frees nothing); the other entries
	// are ignored. The answer is OK, or INVALID_ARGUMENT when a listed id
	// is not a lease id at all (after the others are given back).
	ReleaseEntryKey = "ratewarden.release"
	// MetadataNamespace is where Envoy keeps the dynamic_metadata of the
	// rate limit filter's answers.
	MetadataNamespace = "envoy.filters.http.ratelimit"
)

// Slots takes slots for decisions on concurrency limits and gives them
// back (*slots.Gate and *slots.Door are).
type Slots interface {
	Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error)
	Release(ctx context.Context, id string) (freed bool, err error)
}

// maxReleaseBytes bounds a release entry's value: a lease for each
// descriptor a call may carry.
var maxReleaseBytes = MaxDescriptors * (slots.MaxLeaseIDBytes + 1)

// SetSlots makes the door take a slot for every allowed descriptor on a
// concurrency limit, deciding through sl (which decides the rate through
// the limiter), and give slots back on release descriptors. Without it a
// descriptor whose limit is a concurrency alone is answered
// FAILED_PRECONDITION. Call it before serving.
func (s *Service) SetSlots(sl Slots) { s.slots = sl }

// metadata is a dynamic_metadata of one string field.
func metadata(key, value string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{key: structpb.NewStringValue(value)}}
}

// release gives back each lease of a release descriptor's list. A lease
// that holds no slot frees nothing; one that is not a lease id at all is
// INVALID_ARGUMENT, after the others are given back.
func (s *Service) release(ctx context.Context, leases string, i int) error {
	if s.slots == nil {
		return status.Errorf(codes.Unimplemented, "descriptors[%d]: this service takes no slots", i)
	}
	var invalid error
	for id := range strings.SplitSeq(leases, ",") {
		if id == "" {
			continue
		}
		_, err := s.slots.Release(ctx, id)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return status.FromContextError(ctx.Err()).Err()
		case errors.Is(err, slots.ErrInvalidLease):
			invalid = err
		default:
			return status.Errorf(codes.Unavailable, "descriptors[%d]: %v", i, err)
		}
	}
	if invalid != nil {
		return status.Errorf(codes.InvalidArgument, "descriptors[%d]: %v", i, invalid)
	}
	return nil
}

// giveBack releases the leases of a call that will not run, even when its
// context has ended (the Slots apply their own deadline).
func (s *Service) giveBack(ctx context.Context, leases []string) {
	ctx = context.WithoutCancel(ctx)
	for _, id := range leases {
		_, _ = s.slots.Release(ctx, id)
	}
}
