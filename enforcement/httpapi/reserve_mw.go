package httpapi

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// costMeter holds the actual cost a handler reports for its reservation.
type costMeter struct {
	mu   sync.Mutex
	cost int64
	set  bool
}

type costMeterKey struct{}

// SetActualCost reports the actual cost of the request ctx belongs to
// (the tokens a completion used, say), for the reserving middleware to
// settle when the handler returns. It reports false when ctx carries no
// reservation (the handler was not behind ReserveMiddleware, or the
// request was not reserved). A negative cost counts as 0. Safe to call
// from any goroutine of the handler; the last call wins.
func SetActualCost(ctx context.Context, cost int64) bool {
	m, ok := ctx.Value(costMeterKey{}).(*costMeter)
	if !ok {
		return false
	}
	m.mu.Lock()
	m.cost, m.set = max(0, cost), true
	m.mu.Unlock()
	return true
}

// AddActualCost adds to the actual cost SetActualCost reports (a stream
// that counts as it goes).
func AddActualCost(ctx context.Context, n int64) bool {
	m, ok := ctx.Value(costMeterKey{}).(*costMeter)
	if !ok {
		return false
	}
	m.mu.Lock()
	m.cost, m.set = max(0, m.cost+n), true
	m.mu.Unlock()
	return true
}

// settleDeadline bounds the settle after a handler: a store that cannot
// be asked makes the limiter queue it instead (Limiter.Settle).
const settleDeadline = 2 * time.Second

// Reserve is Allow with the cost (Guard.Cost, else the policy's) as an
// estimate that is reserved: when the request may proceed it returns the
// request to hand the handler, carrying the cost meter SetActualCost
// writes, and settle, which the caller must run when the handler is done
// — deferred, so that it runs even when the handler panics. settle
// charges the cost the handler reported, or the estimate when it reported
// none.
func (g *Guard) Reserve(w http.ResponseWriter, r *http.Request, s Settler) (next *http.Request, settle func(), ok bool) {
	req := g.request(r)
	key := req.Key
	req.Reserve = true
	d, ok := g.check(w, r, req)
	if !ok {
		return r, func() {}, false
	}
	r, releaseSlot := g.hold(r, &d) // a concurrency limit's slot, if any
	if d.Reservation == "" {
		// Allowed without a reservation (dry run past the limit): there
		// is nothing to settle.
		return r, releaseSlot, true
	}
	m := &costMeter{}
	next = r.WithContext(context.WithValue(r.Context(), costMeterKey{}, m))
	settle = func() {
		defer releaseSlot()
		m.mu.Lock()
		cost, set := m.cost, m.set
		m.mu.Unlock()
		if !set {
			cost = d.Cost
		}
		// The request's context may be over (the client left); the
		// settle is owed all the same.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleDeadline)
		defer cancel()
		if _, err := s.Settle(ctx, d.Reservation, cost); err != nil && g.Log != nil {
			g.Log.Error("settle after the handler failed", "key", key, "scope", req.Scope, "cost", cost, "err", err)
		}
	}
	return next, settle, true
}

// ReserveMiddleware is Middleware for costs known after the work: it
// reserves the estimate before the handler, and settles the actual cost
// the handler reported with SetActualCost after it — also when the
// handler panics (the panic then goes on).
func ReserveMiddleware(g *Guard, s Settler) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r, settle, ok := g.Reserve(w, r, s)
			if !ok {
				return
			}
			defer settle()
			next.ServeHTTP(w, r)
		})
	}
}
