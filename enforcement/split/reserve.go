package split

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Reserver is an enforcement.Reserver that sends the reservations,
// settles and charges of a limit with Split = N > 1 to one of its N
// sub-buckets, as Authority sends its decisions, and passes the rest to
// next unchanged. The sub-bucket is chosen by the reservation id (a hash of
// it, modulo N) rather than at random: the id carries random bytes, so the
// choice spreads like a random one, and the settle, on any instance,
// recomputes it and finds the sub-bucket, and the record, its reservation
// spent. A charge has an id of its own and so a sub-bucket of its own.
// Remaining is scaled back to the whole key as for a decision. It is safe
// for concurrent use.
type Reserver struct {
	next enforcement.Reserver
}

var _ enforcement.Reserver = (*Reserver)(nil)

// NewReserver wraps next.
func NewReserver(next enforcement.Reserver) *Reserver { return &Reserver{next: next} }

// SubOf is the sub-bucket, in [0, n), of reservation id on a key split n ways.
func SubOf(id string, n int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum64() % uint64(n))
}

// Reserve implements enforcement.Reserver. The limiter refuses an
// estimate beyond one sub-bucket's capacity before it gets here
// (Limit.Capacity).
func (r *Reserver) Reserve(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	n := lim.Split
	if n <= 1 {
		return r.next.Reserve(ctx, key, scope, lim, cost, id, ttl)
	}
	v, err := r.next.Reserve(ctx, SubKey(key, SubOf(id, n)), scope, SubLimit(lim), cost, id, ttl)
	if err != nil {
		return v, err
	}
	return scale(v, n, lim), nil
}

// Settle implements enforcement.Reserver: on the sub-bucket the
// reservation spent. A settle beyond the estimate may take that
// sub-bucket into debt, which its next decisions pay off.
func (r *Reserver) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	n := lim.Split
	if n <= 1 {
		return r.next.Settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
	}
	s, err := r.next.Settle(ctx, SubKey(key, SubOf(id, n)), scope, id, SubLimit(lim), cost, unrecorded, ttl)
	if err != nil {
		return s, err
	}
	s.Remaining = min(lim.Burst, s.Remaining*int64(n))
	return s, nil
}
