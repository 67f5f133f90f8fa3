package enforcement

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultSettleQueue bounds the settles and charges an instance holds
// while the store cannot be asked (Config.SettleQueue).
const DefaultSettleQueue = 100_000

// ErrSettleQueueFull: the store could not be asked and the queue of
// settles waiting for it is full; nothing was charged or queued.
var ErrSettleQueueFull = errors.New("settle queue full")

// pendingSettle is one settle (or charge) to apply.
type pendingSettle struct {
	kind             string // KindSettle or KindCharge
	id               string // the reservation id (a charge's own, unrecorded)
	key, scope, tier string
	domain           string // the Envoy domain a charge came through
	cost             int64
	estimate         int64 // the id's (a degraded reservation's, for its events)
	issued           int64 // the id's: when the reservation was made (ms)
	unrecorded       bool
	res              Resolved
}

// settleQueue holds settles the store could not be asked about, in order.
// A settle is applied by the store's script, keyed by its id, at most
// once: retrying one that timed out (and so may have landed) is answered
// "already settled" and dropped. So the queue is retried until the store
// answers, and neither loses a settle nor applies one twice — except what
// an instance that stops with settles still queued loses (RunSettles
// tries once more as it stops).
type settleQueue struct {
	mu   sync.Mutex
	q    []pendingSettle
	have map[string]struct{} // ids queued: a caller's retry is not queued twice
}

// queueSettle holds p for RunSettles, after the store failed with cause.
func (l *Limiter) queueSettle(p pendingSettle, cause error) (Settlement, error) {
	sq := &l.settles
	sq.mu.Lock()
	defer sq.mu.Unlock()
	if _, dup := sq.have[p.id]; !dup {
		if len(sq.q) >= l.cfg.SettleQueue {
			return Settlement{}, fmt.Errorf("enforcement: %w (%d) while the store fails: %w", ErrSettleQueueFull, len(sq.q), cause)
		}
		if sq.have == nil {
			sq.have = make(map[string]struct{})
		}
		sq.have[p.id] = struct{}{}
		sq.q = append(sq.q, p)
	}
	s := Settlement{Kind: p.kind, Key: p.key, Scope: p.scope, Tier: p.tier, Policy: p.res.Policy, Limit: p.res.Burst, Charged: p.cost, Queued: true}
	if p.kind == KindSettle {
		s.Reservation = p.id
	}
	return s, nil
}

// PendingSettles is the number of settles and charges waiting for the
// store.
func (l *Limiter) PendingSettles() int {
	l.settles.mu.Lock()
	defer l.settles.mu.Unlock()
	return len(l.settles.q)
}

// settleRetry is how often RunSettles retries the queue, and the deadline
// of each retried call.
const (
	settleRetry    = 250 * time.Millisecond
	settleDeadline = 2 * time.Second
)

// RunSettles applies queued settles until ctx ends, in order, each retried
// until the store answers; as ctx ends it tries the queue once more with a
// short deadline. It returns nil when ctx ends.
func (l *Limiter) RunSettles(ctx context.Context) error {
	t := time.NewTicker(settleRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), settleDeadline)
			l.DrainSettles(final)
			cancel()
			return nil
		case <-t.C:
			l.DrainSettles(ctx)
		}
	}
}

// DrainSettles applies the queued settles in order until the store fails
// or the queue is empty, and returns how many are left.
func (l *Limiter) DrainSettles(ctx context.Context) int {
	sq := &l.settles
	for {
		sq.mu.Lock()
		if len(sq.q) == 0 {
			sq.mu.Unlock()
			return 0
		}
		p := sq.q[0]
		sq.mu.Unlock()

		call, cancel := context.WithTimeout(ctx, settleDeadline)
		start := l.read()
		r, pool := l.reserverFor(p.res.Global)
		s, err := r.Settle(call, p.key, p.scope, p.id, p.res.Limit, p.cost, p.unrecorded, l.cfg.ReservationTTL)
		cancel()
		if err != nil && !errors.Is(err, ErrReservationNotFound) && !errors.Is(err, ErrAlreadySettled) {
			if l.cfg.Observer != nil && ctx.Err() == nil {
				l.cfg.Observer.AuthorityFailed(err)
			}
			return l.PendingSettles()
		}
		if err == nil {
			l.settled(&s, p, pool, start)
		}
		// Not found: the reservation expired while queued, and its
		// estimate stands. Already settled: an earlier try landed.
		sq.mu.Lock()
		sq.q[0] = pendingSettle{}
		sq.q = sq.q[1:]
		delete(sq.have, p.id)
		sq.mu.Unlock()
	}
}
