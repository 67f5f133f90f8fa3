package enforcement

// Design: a cost known only after the work is reserved, then settled.
//
// A reservation is a decision (Request.Reserve) that spends the estimate
// and leaves a record in the bucket's own store: Redis, under the bucket's
// hash tag, so that a settle arriving at any limiter instance finds it, and
// one script can read the record and move the bucket atomically; in
// single-node mode the MemoryAuthority's map. Settling marks the record
// settled and moves the bucket by estimate − actual: a refund (capped at
// the bucket's capacity) or a further charge that may take the bucket below
// zero. A bucket below zero is in debt: every request on it is rejected
// (Bucket.Take: no cost, not even 0, fits below zero) and the retry time is
// the time the refill needs to pay the debt off and then afford the cost.
//
// A record lives for the reservation TTL and is never touched by a
// background job: a reservation nobody settles simply expires, and its
// estimate, spent when it was made, stands — it is settled at its estimate
// by doing nothing. A settled record is kept one more TTL, so a second
// settle is told "already settled" (and charges nothing) rather than "not
// found".
//
// The reservation id names its key, scope and tier (the settle resolves
// the limit from them, as a decision does) and a random nonce; the record
// is stored under the whole id, so an id altered in any byte finds no
// record. A reservation made while the store could not be asked
// (degraded) has no record: its estimate was spent only on the tightened
// local bucket, so its settle charges the whole actual cost to the store,
// once, under a settled marker written by the same script.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// DefaultReservationTTL is how long an unsettled reservation lives before
// it is settled at its estimate (Config.ReservationTTL).
const DefaultReservationTTL = 5 * time.Minute

// Errors a settle answers with.
var (
	// ErrReservationNotFound: no such reservation (never made, altered, or
	// expired and so settled at its estimate). Nothing was charged.
	ErrReservationNotFound = errors.New("reservation not found")
	// ErrAlreadySettled: the reservation was settled before; nothing was
	// charged this time.
	ErrAlreadySettled = errors.New("reservation already settled")
	// ErrReserveUnsupported: the limiter has no store that keeps
	// reservations (Config.Reservations).
	ErrReserveUnsupported = errors.New("reservations are not supported by this store")
)

// Reserver is the part of a store that keeps reservations and charges
// costs after the fact, on the same buckets (and quota counters) that Take
// spends. Implementations are safe for concurrent use; MemoryAuthority and
// redisstore's stores are the two.
type Reserver interface {
	// Reserve decides like Take and, when allowed, keeps a record of the
	// reservation id for ttl, atomically with the spend.
	Reserve(ctx context.Context, key, scope string, lim Limit, cost int64, id string, ttl time.Duration) (Verdict, error)
	// Settle charges the actual cost of reservation id: the bucket moves
	// by estimate − cost (a charge beyond the estimate may go below zero)
	// and the record is marked settled for ttl. unrecorded says the
	// reservation was made while the store could not be asked: it has no
	// record, so the whole cost is charged, once. The errors are
	// ErrReservationNotFound and ErrAlreadySettled, or the store's.
	Settle(ctx context.Context, key, scope, id string, lim Limit, cost int64, unrecorded bool, ttl time.Duration) (Settlement, error)
}

// Settlement kinds, as the events spell them.
const (
	KindSettle = "settle"
	KindCharge = "charge"
)

// Settlement is the answer to a settle or a charge. The store fills the
// numbers; the limiter fills who and what.
type Settlement struct {
	Kind        string // KindSettle or KindCharge
	Key, Scope  string
	Tier        string
	Domain      string // the Envoy rate limit domain a charge came through
	Policy      string
	Reservation string // the settled id (empty for a charge)
	Limit       int64  // the bucket's capacity

	Estimate   int64         // what the reservation spent (0 for a charge)
	Charged    int64         // the actual cost
	Refunded   int64         // estimate − actual when positive: tokens given back
	Remaining  int64         // whole tokens left, rounded down: negative in debt
	Debt       int64         // whole tokens owed, rounded up; 0 when not in debt
	ResetAt    time.Time     // when the bucket is full again
	RetryAfter time.Duration // until one more token is there (0 when one is)
	QuotaUsed  int64         // tokens spent in the quota window (0 without quota)
	// Warning: after the settlement, consumption of the bucket or the
	// quota is at or above the soft limit (as for a decision), so that
	// soft-limit webhooks follow actual costs.
	Warning bool
	// ReservedAt is when the settled reservation was made (its decision's
	// time, to the ms); zero for a charge.
	ReservedAt time.Time
	// Queued: the store could not be asked, so the settle is held by this
	// instance and applied when the store answers (Limiter.Settle).
	Queued bool
	// Now is the store's clock when it settled.
	Now time.Time
}

// Charge refills the bucket up to now (µs) like Take, then moves it by
// delta tokens: a positive delta is spent even below zero (debt), a
// negative one given back, capped at burst. It returns the tokens left and
// the µs until full.
func (b *Bucket) Charge(now int64, rate float64, burst int64, delta int64) (tokens float64, resetAfterUS int64) {
	capacity := float64(burst)
	tokens = capacity
	if b.TS != 0 {
		if now < b.TS {
			now = b.TS
		}
		tokens = min(capacity, b.Tokens+float64(now-b.TS)*rate/1e6)
	}
	tokens = min(capacity, tokens-float64(delta))
	b.Tokens, b.TS = tokens, now
	return tokens, ceilUS((capacity - tokens) / rate)
}

// debtOf is the whole tokens a bucket of tokens owes, rounded up.
func debtOf(tokens float64) int64 {
	if tokens >= -epsilon {
		return 0
	}
	return int64(math.Ceil(-tokens - epsilon))
}

// Reservation ids: base64url (no padding) of a version byte, 12 random
// bytes, the time it was made (ms since the epoch: its decision's), the estimate, and the key, scope
// and tier, each length-prefixed. The estimate in the id is what a settle
// reports and records; the store's record is what it charges from.
const (
	idRecorded   = 1 // the store holds a record
	idUnrecorded = 2 // made while degraded: no record
	idNonce      = 12
	maxIDLen     = 4096
)

// reservationID is a parsed reservation id.
type reservationID struct {
	kind             byte
	issued           int64 // ms since the epoch: the reserving decision's time
	estimate         int64
	key, scope, tier string
}

func newReservationID(kind byte, issued time.Time, estimate int64, key, scope, tier string) string {
	b := make([]byte, 0, 1+idNonce+8+len(key)+len(scope)+len(tier)+15)
	b = append(b, kind)
	var nonce [idNonce]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails
	b = append(b, nonce[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(issued.UnixMilli()))
	b = binary.AppendUvarint(b, uint64(estimate))
	for _, s := range []string{key, scope, tier} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseReservationID(id string) (reservationID, error) {
	var r reservationID
	if id == "" || len(id) > maxIDLen {
		return r, ErrReservationNotFound
	}
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) < 1+idNonce+8 || (b[0] != idRecorded && b[0] != idUnrecorded) {
		return r, ErrReservationNotFound
	}
	r.kind = b[0]
	r.issued = int64(binary.BigEndian.Uint64(b[1+idNonce:]))
	b = b[1+idNonce+8:]
	est, w := binary.Uvarint(b)
	if w <= 0 || est > MaxCost {
		return r, ErrReservationNotFound
	}
	r.estimate, b = int64(est), b[w:]
	var parts [3]string
	for i := range parts {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return r, ErrReservationNotFound
		}
		parts[i], b = string(b[w:w+int(n)]), b[w+int(n):]
	}
	if len(b) != 0 || parts[0] == "" || parts[1] == "" {
		return r, ErrReservationNotFound
	}
	r.key, r.scope, r.tier = parts[0], parts[1], parts[2]
	return r, nil
}

// SettlementRecorder is a Recorder that also receives every settlement
// (settle and charge), for metering. It must never block.
type SettlementRecorder interface {
	RecordSettlement(s Settlement, at time.Time)
}

// ReservationTTL is the TTL in force (Config.ReservationTTL).
func (l *Limiter) ReservationTTL() time.Duration { return l.cfg.ReservationTTL }

// reserveTake is the store call of a decision that reserves: Reserve on
// the reservation store (reserverFor), with a fresh id the decision
// carries when allowed.
func (l *Limiter) reserveTake(ctx context.Context, req *Request, d *Decision, lim Limit, global bool, cost int64, start reading) (Verdict, error) {
	if l.cfg.Reservations == nil {
		return Verdict{}, ErrReserveUnsupported
	}
	// Issued at the decision's own time (its event's): the settle's
	// actual cost is accounted to the same minute as the estimate.
	id := newReservationID(idRecorded, l.wall(start), cost, req.Key, req.Scope, req.Tier)
	r, _ := l.reserverFor(global)
	v, err := r.Reserve(ctx, req.Key, req.Scope, lim, cost, id, l.cfg.ReservationTTL)
	if err == nil && v.Allowed {
		d.Reservation = id
	}
	return v, err
}

// reserverFor is where reservations, settles and charges of a limit are
// kept: a global limit's (global: resolved Global) in the region's pool of
// its global budget (pool true), so that they spend the global budget as
// its decisions do, when Config.Global keeps reservations; any other's in
// Config.Reservations. Every path to a store asks it here, the settle
// queue's too: a reservation is found only where it was made.
func (l *Limiter) reserverFor(global bool) (r Reserver, pool bool) {
	if global {
		if r, ok := l.cfg.Global.(Reserver); ok {
			return r, true
		}
	}
	return l.cfg.Reservations, false
}

// degradedReservation gives an allowed degraded decision that reserves an
// id with no record: its settle charges the actual cost in full.
func (l *Limiter) degradedReservation(req *Request, d *Decision, start reading) {
	if req.Reserve && d.WouldAllow && l.cfg.Reservations != nil {
		d.Reservation = newReservationID(idUnrecorded, l.wall(start), d.Cost, req.Key, req.Scope, req.Tier)
	}
}

// Settle charges the actual cost of a reservation made by Check with
// Request.Reserve (on any instance sharing the store). An unknown,
// altered or expired id is ErrReservationNotFound, a second settle
// ErrAlreadySettled; neither charges anything. When the store cannot be
// asked the settle is queued (Settlement.Queued) and applied, once, when
// the store answers again (RunSettles); a full queue is an error.
func (l *Limiter) Settle(ctx context.Context, id string, cost int64) (Settlement, error) {
	if cost < 0 || cost > MaxCost {
		return Settlement{}, fmt.Errorf("%w: cost must be in [0, %d]", ErrInvalidRequest, MaxCost)
	}
	if l.cfg.Reservations == nil {
		return Settlement{}, ErrReserveUnsupported
	}
	r, err := parseReservationID(id)
	if err != nil {
		return Settlement{}, err
	}
	start := l.read()
	if l.wall(start).UnixMilli() >= r.issued+2*l.cfg.ReservationTTL.Milliseconds() {
		// Past its expiry and past the settled record's life: no store
		// holds anything about it any more.
		return Settlement{}, ErrReservationNotFound
	}
	res, err := l.policy.Load().p.Resolve(r.key, r.scope, r.tier)
	if err != nil {
		return Settlement{}, err
	}
	p := pendingSettle{kind: KindSettle, id: id, key: r.key, scope: r.scope, tier: r.tier, cost: cost, unrecorded: r.kind == idUnrecorded, estimate: r.estimate, issued: r.issued, res: res}
	return l.applySettle(ctx, p, start)
}

// applySettle asks the store to apply p, and queues it when the store
// cannot be asked.
func (l *Limiter) applySettle(ctx context.Context, p pendingSettle, start reading) (Settlement, error) {
	r, pool := l.reserverFor(p.res.Global)
	s, err := r.Settle(ctx, p.key, p.scope, p.id, p.res.Limit, p.cost, p.unrecorded, l.cfg.ReservationTTL)
	switch {
	case err == nil:
		l.settled(&s, p, pool, start)
		return s, nil
	case errors.Is(err, ErrReservationNotFound), errors.Is(err, ErrAlreadySettled):
		return Settlement{}, err
	case ctx.Err() != nil:
		// The caller went away; what the store did is unknown, and the
		// caller, told nothing, will retry with the same id (a charge
		// has none the caller knows: it is queued like a store failure).
		if p.kind == KindSettle {
			return Settlement{}, fmt.Errorf("enforcement: settle abandoned by the caller: %w", ctx.Err())
		}
	}
	if l.cfg.Observer != nil {
		l.cfg.Observer.AuthorityFailed(err)
	}
	return l.queueSettle(p, err)
}

// Charge charges a cost known after the fact on req's bucket (Key, Scope,
// Tier, Cost), with no decision and no reservation: the bucket may go
// below zero. A charge is a settle of a fresh id with no record, so that
// a charge retried after a timeout (which may have landed) is applied
// once. When the store cannot be asked it is queued like a settle.
func (l *Limiter) Charge(ctx context.Context, req Request) (Settlement, error) {
	if req.Key == "" || req.Scope == "" || req.Cost < 0 || req.Cost > MaxCost {
		return Settlement{}, fmt.Errorf("%w: key and scope are required and cost must be in [0, %d]", ErrInvalidRequest, MaxCost)
	}
	if l.cfg.Reservations == nil {
		return Settlement{}, ErrReserveUnsupported
	}
	start := l.read()
	res, err := l.policy.Load().p.Resolve(req.Key, req.Scope, req.Tier)
	if err != nil {
		return Settlement{}, err
	}
	id := newReservationID(idUnrecorded, l.wall(start), 0, req.Key, req.Scope, req.Tier)
	p := pendingSettle{kind: KindCharge, id: id, key: req.Key, scope: req.Scope, tier: req.Tier, domain: req.Domain, cost: req.Cost, unrecorded: true, res: res}
	return l.applySettle(ctx, p, start)
}

// MaxCost is the largest cost a request, a settle or a charge may name.
const MaxCost = limits.MaxCost

// settled completes a settlement the store made (pool: the region's pool
// of a global budget, reserverFor): who and what, what the local tier
// learns from it, and its event.
func (l *Limiter) settled(s *Settlement, p pendingSettle, pool bool, start reading) {
	s.Kind, s.Key, s.Scope, s.Tier, s.Domain = p.kind, p.key, p.scope, p.tier, p.domain
	if p.kind == KindSettle {
		s.Reservation, s.ReservedAt = p.id, time.UnixMilli(p.issued)
		if p.unrecorded {
			// Made while degraded: the store charged the whole cost (it
			// never spent the estimate), but the caller and the events
			// see the estimate the decision spent, on its local bucket
			// and in its decision event.
			s.Estimate, s.Refunded = p.estimate, max(0, p.estimate-p.cost)
		}
	}
	s.Policy, s.Limit = p.res.Policy, p.res.Burst
	if !pool {
		// A pool is not the key's bucket: the global store judges its
		// soft limit (Settlement.Warning as it returned it).
		s.Warning = p.res.Limit.SoftLimitReached(float64(s.Remaining), s.QuotaUsed)
	}
	if p.res.Tier != "" {
		s.Tier = p.res.Tier
	}
	l.learnSettlement(p.key, p.scope, p.res.Limit, s)
	if rec, ok := l.cfg.Recorder.(SettlementRecorder); ok {
		rec.RecordSettlement(*s, l.wall(start))
	}
}

// learnSettlement tells the local tier what a settlement left in the
// bucket, so that this instance rejects a bucket in debt without asking
// the store. Only an entry the table already holds learns.
func (l *Limiter) learnSettlement(key, scope string, lim Limit, s *Settlement) {
	if lim.Split > 1 {
		return
	}
	e, ok := l.entries.lookup(bucketID{key, scope})
	if !ok {
		return
	}
	now := micros(l.read().off)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.res == nil || e.res.res.Limit != lim {
		return
	}
	if e.x != nil {
		e.x.rej.rejectUntil, e.x.rej.notBefore = 0, 0
	}
	reset := s.ResetAt.Sub(s.Now).Seconds()
	e.known.mirror = Bucket{Tokens: float64(lim.Burst) - reset*lim.Rate, TS: now}
	if s.Refunded > 0 && e.local.TS != 0 {
		// The reservation spent its estimate from the local bucket too;
		// what the settle gives back is there again, or the local tier
		// would reject what the store holds for as long as its own refill
		// takes. Settled on another instance than the reservation's, the
		// tokens land in a bucket that did not spend them: the local tier
		// only passes more requests on to the store, which decides.
		e.local.Tokens = min(float64(lim.Burst), e.local.refilled(now, l.localRate(lim.Rate), lim.Burst)+float64(s.Refunded))
		e.local.TS = now
	}
}

var _ Reserver = (*Stores)(nil)

// reserverOf is the limit's store as a Reserver.
func (s *Stores) reserverOf(name string) (Reserver, error) {
	st, err := s.of(name)
	if err != nil {
		return nil, err
	}
	r, ok := st.(Reserver)
	if !ok {
		return nil, ErrReserveUnsupported
	}
	return r, nil
}

// Reserve is Reserver.Reserve on the limit's store.
func (s *Stores) Reserve(ctx context.Context, key, scope string, lim Limit, cost int64, id string, ttl time.Duration) (Verdict, error) {
	r, err := s.reserverOf(lim.Store)
	if err != nil {
		return Verdict{}, err
	}
	return r.Reserve(ctx, key, scope, lim, cost, id, ttl)
}

// Settle is Reserver.Settle on the limit's store.
func (s *Stores) Settle(ctx context.Context, key, scope, id string, lim Limit, cost int64, unrecorded bool, ttl time.Duration) (Settlement, error) {
	r, err := s.reserverOf(lim.Store)
	if err != nil {
		return Settlement{}, err
	}
	return r.Settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
}
