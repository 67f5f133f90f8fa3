// Package guard puts a deadline and a circuit breaker on every call to the
// shared authority, so that a slow store fails fast instead of becoming the
// latency it was supposed to prevent, and a dead one is not asked at all
// until a probe says it is back.
package guard

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Settings tune the guard. The zero value of each field is its documented default.
type Settings struct {
	// Timeout is the deadline of one store call (default 5ms: within the
	// limiter's latency budget, well above a healthy loopback or
	// same-datacentre round trip).
	Timeout time.Duration
	// ConsecutiveFailures opens the breaker (default 5).
	ConsecutiveFailures uint32
	// OpenFor is how long the breaker stays open before one probe (default 1s).
	OpenFor time.Duration
	// Probes is how many calls are let through while half-open; that many
	// successes close the breaker, one failure reopens it (default 3). The
	// rest keep deciding degraded, so recovery brings no thundering herd.
	Probes uint32
}

// State is the breaker's state, for metrics.
type State int

// Breaker states; the values are what the breaker-state gauge reports.
const (
	Closed   State = 0
	HalfOpen State = 1
	Open     State = 2
)

// Observer receives what the guard sees. Implementations must be safe for
// concurrent use and cheap.
type Observer interface {
	StoreCall(took time.Duration, err error)
	BreakerState(s State)
}

// Authority is an enforcement.Authority behind a deadline and a breaker.
type Authority struct {
	next    enforcement.Authority
	timeout time.Duration
	cb      *gobreaker.CircuitBreaker[enforcement.Verdict]
	obs     Observer
}

var _ enforcement.Authority = (*Authority)(nil)

// New wraps next. obs and log may be nil.
func New(next enforcement.Authority, s Settings, obs Observer, log *slog.Logger) *Authority {
	if s.Timeout <= 0 {
		s.Timeout = 5 * time.Millisecond
	}
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = 5
	}
	if s.OpenFor <= 0 {
		s.OpenFor = time.Second
	}
	if s.Probes == 0 {
		s.Probes = 3
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Authority{next: next, timeout: s.Timeout, obs: obs}
	a.cb = gobreaker.NewCircuitBreaker[enforcement.Verdict](gobreaker.Settings{
		Name:        "shared-store",
		MaxRequests: s.Probes,
		Timeout:     s.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= s.ConsecutiveFailures },
		// A caller that went away is not the store's fault.
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			// Logged once per transition, never per request.
			switch {
			case to == gobreaker.StateOpen && from == gobreaker.StateClosed:
				log.Error("shared store unavailable: breaker open, deciding with tightened local limits (source=degraded)")
			case to == gobreaker.StateOpen:
				log.Warn("shared store probe failed: breaker open again")
			case to == gobreaker.StateHalfOpen:
				log.Info("shared store breaker half-open: probing")
			case to == gobreaker.StateClosed:
				log.Info("shared store recovered: breaker closed, decisions are shared again")
			}
			if obs != nil {
				obs.BreakerState(stateOf(to))
			}
		},
	})
	if obs != nil {
		obs.BreakerState(Closed)
	}
	return a
}

func stateOf(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return Open
	case gobreaker.StateHalfOpen:
		return HalfOpen
	}
	return Closed
}

// State is the breaker's current state.
func (a *Authority) State() State { return stateOf(a.cb.State()) }

// Take implements enforcement.Authority.
func (a *Authority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	return a.cb.Execute(func() (enforcement.Verdict, error) {
		ctx, cancel := context.WithTimeout(ctx, a.timeout)
		defer cancel()
		start := time.Now()
		v, err := a.next.Take(ctx, key, scope, lim, cost)
		if a.obs != nil {
			a.obs.StoreCall(time.Since(start), err)
		}
		return v, err
	})
}
