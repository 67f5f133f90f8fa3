// Package slots is the concurrency limit: at most N requests of a key (and
// scope) in flight at once across the whole fleet, each holding a slot
// under a lease until it gives the slot back, with priority classes that
// shed the lower classes first when the slots run short.
//
// # Design
//
// The slots of (key, scope) are one set in the shared store, a Redis sorted
// set of lease ids scored by expiry (redisstore.Concurrency), changed only
// by one atomic script per operation, on the store's own clock (Redis
// TIME):
//
//   - acquire drops the expired members, then admits the lease id when
//     fewer members than the class's limit remain (⌊share × N⌋, at least 1;
//     N for a class of share 1), scored now + TTL;
//   - renew drops the expired members, then moves the id's expiry to
//     now + TTL only if it is still a member: an expired lease cannot come
//     back;
//   - release drops the expired members, then removes the id: it frees a
//     slot only if that id held one, never a slot another request holds.
//
// A lease id is random (128 bits from crypto/rand) and names the key, the
// scope and the store that hold it (LeaseID), so that any limiter instance
// can renew or release it; it cannot be guessed, so nobody can release a
// slot they were not given.
//
// # The bounds
//
//  1. Slots held ≤ N at every instant, on the store's clock: only acquire
//     adds a member, and it counts the live members first, atomically.
//  2. A slot whose holder dies (process killed, network cut) returns at the
//     latest when its lease ends: at most TTL after its last renewal, so at
//     most TTL + one renew interval after the holder's last sign of life.
//     The next acquire drops it; nothing has to sweep.
//  3. A release or renew that arrives late (after expiry) changes nothing:
//     the member is gone, and the lease id is never issued again.
//
// Requests in flight as the callers see them stay ≤ N as long as each
// holder stops its work when its lease is lost (Renew answers
// ErrLeaseNotFound; the middleware cancels the handler's context). A
// holder cut off from the store for longer than the TTL cannot know, and
// may run on for up to one renew interval after the store has given its
// slot to another request: that is the price of a lease on a clock the
// holder does not share, and why the TTL is seconds, not minutes.
//
// When the store cannot be asked, the Gate admits against an in-process
// set (Memory) of ⌈N ÷ instances⌉ slots per key: protection degrades from
// exact to approximate and never vanishes, as the rate limit's does.
package slots

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// DefaultTTL is how long a slot is held without a renewal
// (LIMITER_LEASE_TTL); MinTTL is the shortest accepted.
const (
	DefaultTTL = 10 * time.Second
	MinTTL     = time.Second
)

// RenewInterval is how often a holder renews a lease of ttl: a third of
// it, so that two renewals in a row can fail (a slow store, a lost
// packet) before the lease ends.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / 3 }

// Errors callers branch on.
var (
	// ErrLeaseNotFound: the lease is not held (never issued, released, or
	// expired and so perhaps another request's slot by now).
	ErrLeaseNotFound = errors.New("lease not found: released or expired")
	// ErrInvalidLease: the id is not a lease id.
	ErrInvalidLease = errors.New("not a lease id")
	// ErrUnknownPriority: the request names a priority class the policy
	// does not define.
	ErrUnknownPriority = errors.New("unknown priority class")
)

// Slot names one lease: the key and scope whose slots it holds, the store
// that holds them (limits.Limit.Store; "" = the default store) and the
// lease's random member id.
type Slot struct {
	Key, Scope, Store string
	// Member is the lease's own id within the set: 22 characters of
	// base64url over 128 random bits.
	Member string
	// Degraded: the lease was issued by this instance's in-process set
	// while the store could not be asked (Memory).
	Degraded bool
}

// Grant is a store's answer to an acquire.
type Grant struct {
	Admitted bool
	// Reason is why a request was not admitted: enforcement.ReasonConcurrency
	// (every slot is held) or enforcement.ReasonShed (the class's share is).
	Reason string
	// Held is the slots held after the call, on the store's own view.
	Held int64
	// ExpiresAt is when an admitted lease ends unless renewed.
	ExpiresAt time.Time
	// RetryAfter, for a request not admitted, is the time until the
	// earliest lease held ends unless its holder renews it: the soonest a
	// slot is sure to come back by itself (one released sooner may be
	// taken by anyone).
	RetryAfter time.Duration
	// Now is the store's clock at the call.
	Now time.Time
}

// Store holds the slot sets. Implementations are safe for concurrent use:
// redisstore.Concurrency (the fleet's, in Redis) and Memory (one process).
type Store interface {
	// Acquire admits s when fewer than limit slots are held (limit ≤
	// capacity, the concurrency limit; a request refused while fewer than
	// capacity are held is shed), leased for ttl. Acquiring a member
	// already held renews it (a retried call takes one slot).
	Acquire(ctx context.Context, s Slot, limit, capacity int64, ttl time.Duration) (Grant, error)
	// Renew moves the lease's end to now + ttl; ErrLeaseNotFound when it
	// is not held.
	Renew(ctx context.Context, s Slot, ttl time.Duration) (expiresAt time.Time, err error)
	// Release gives the slot back; freed is false when the lease was not
	// held (released before, or expired), and then nothing changed.
	Release(ctx context.Context, s Slot) (freed bool, err error)
}

// ClassLimit is how many slots of capacity a class of share may hold:
// ⌊share × capacity⌋, at least 1, at most capacity.
func ClassLimit(share float64, capacity int64) int64 {
	n := int64(share * float64(capacity))
	return min(capacity, max(1, n))
}

// NewMember draws a lease's member id.
func NewMember() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

const (
	leaseVersion  = 1
	flagDegraded  = 1
	memberLen     = 22 // base64url of 16 bytes
	maxStoreBytes = 64
)

// LeaseID is the lease id of s, as /check gives it and /release and /renew
// take it: base64url of a version, flags, the store, key and scope (each
// length-prefixed) and the member.
func LeaseID(s Slot) string {
	b := make([]byte, 0, 8+len(s.Store)+len(s.Key)+len(s.Scope)+memberLen)
	var flags byte
	if s.Degraded {
		flags |= flagDegraded
	}
	b = append(b, leaseVersion, flags, byte(len(s.Store)))
	b = append(b, s.Store...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(s.Key)))
	b = append(b, s.Key...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(s.Scope)))
	b = append(b, s.Scope...)
	b = append(b, s.Member...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// MaxLeaseIDBytes bounds a lease id (the longest key, scope and store).
var MaxLeaseIDBytes = base64.RawURLEncoding.EncodedLen(7 + maxStoreBytes + limits.MaxKeyBytes + limits.MaxScopeBytes + memberLen)

// ParseLeaseID reads a lease id; ErrInvalidLease when it is not one.
func ParseLeaseID(id string) (Slot, error) {
	if len(id) > MaxLeaseIDBytes {
		return Slot{}, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidLease, len(id), MaxLeaseIDBytes)
	}
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) < 3 || b[0] != leaseVersion {
		return Slot{}, ErrInvalidLease
	}
	var s Slot
	s.Degraded = b[1]&flagDegraded != 0
	n := int(b[2])
	b = b[3:]
	if n > maxStoreBytes || len(b) < n+2 {
		return Slot{}, ErrInvalidLease
	}
	s.Store, b = string(b[:n]), b[n:]
	n, b = int(binary.BigEndian.Uint16(b)), b[2:]
	if n == 0 || n > limits.MaxKeyBytes || len(b) < n+2 {
		return Slot{}, ErrInvalidLease
	}
	s.Key, b = string(b[:n]), b[n:]
	n, b = int(binary.BigEndian.Uint16(b)), b[2:]
	if n == 0 || n > limits.MaxScopeBytes || len(b) != n+memberLen {
		return Slot{}, ErrInvalidLease
	}
	s.Scope, s.Member = string(b[:n]), string(b[n:])
	if _, err := base64.RawURLEncoding.DecodeString(s.Member); err != nil {
		return Slot{}, ErrInvalidLease
	}
	return s, nil
}
