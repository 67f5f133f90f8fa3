// Package guard puts a deadline and a circuit breaker on every call to the
// shared authority, so that a slow store fails fast instead of becoming the
// latency it was supposed to prevent, and a dead one is not asked at all
// until a probe says it is back.
//
// The deadline separates a late store from a starved process. A call that
// has no reply after Timeout fails at once when this process had the CPU
// meanwhile: the store is late. When the process itself was waiting for a
// CPU (stress on the machine, GC, a pipeline queue behind a busy core), the
// scheduler is late, not the store: the call may wait on, until it has had
// Timeout + StarvedGrace of time in which the process ran, or MaxWait in
// all. Scheduler lag is measured by one probe goroutine per process that
// runs while calls are in flight (see lag.go). Half-open probes are judged
// alike: after a restart their first calls dial and reload the script, and
// on a starved machine a probe held to Timeout alone keeps the breaker open
// against a store that is back. Only store failures count
// against the breaker and as store errors; a caller that gave up (its
// context canceled or its own deadline passed) is nobody's failure.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Settings tune the guard. The zero value of each field is its documented default.
type Settings struct {
	// Timeout is the deadline of one store call (default 5ms: within the
	// limiter's latency budget, well above a healthy loopback or
	// same-datacentre round trip). A call with no reply after Timeout, while
	// this process was running, is a store failure.
	Timeout time.Duration
	// StarvedGrace is the extra time a call may wait when this process was
	// starved of CPU during it (default 100ms). The call fails once it has
	// waited Timeout + StarvedGrace of time in which the process ran (wall
	// time minus the measured scheduler lag).
	StarvedGrace time.Duration
	// MaxWait bounds any call in wall time, however starved the process
	// (default 1s, at least Timeout): the store client's own read timeout.
	// It is also the deadline the store call's context carries, so a
	// pipeline or a client read never outlives it.
	MaxWait time.Duration
	// ConsecutiveFailures opens the breaker (default 5).
	ConsecutiveFailures uint32
	// OpenFor is how long the breaker stays open before one probe (default 1s).
	OpenFor time.Duration
	// Probes is how many calls are let through while half-open; that many
	// successes close the breaker, one failure reopens it (default 3). The
	// rest keep deciding degraded, so recovery brings no thundering herd.
	Probes uint32
}

func (s Settings) withDefaults() Settings {
	if s.Timeout <= 0 {
		s.Timeout = 5 * time.Millisecond
	}
	if s.StarvedGrace <= 0 {
		s.StarvedGrace = 100 * time.Millisecond
	}
	if s.MaxWait <= 0 {
		s.MaxWait = time.Second
	}
	s.MaxWait = max(s.MaxWait, s.Timeout)
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = 5
	}
	if s.OpenFor <= 0 {
		s.OpenFor = time.Second
	}
	if s.Probes == 0 {
		s.Probes = 3
	}
	return s
}

// ErrStoreUnavailable is satisfied (errors.Is) by every failure that is the
// store's: the breaker open, a store error, the guard's deadline. An error
// from Take or Do that does not satisfy it is the caller's own: its context
// was canceled (errors.Is(err, context.Canceled)) or its own deadline passed
// (errors.Is(err, context.DeadlineExceeded)). A store failure never
// satisfies either context error, whatever the store client returned.
var ErrStoreUnavailable = errors.New("shared store unavailable")

// storeError is a failure of the store.
type storeError struct {
	msg string
	err error // nil, or the cause (never a context error: see Unwrap)
}

func (e *storeError) Error() string {
	if e.err == nil {
		return "shared store unavailable: " + e.msg
	}
	return "shared store unavailable: " + e.msg + ": " + e.err.Error()
}

func (e *storeError) Is(target error) bool { return target == ErrStoreUnavailable }

// Unwrap hides a context error of the store's client: the guard cancels the
// call's context itself, and a caller must not mistake that for its own.
func (e *storeError) Unwrap() error {
	if errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.DeadlineExceeded) {
		return nil
	}
	return e.err
}

// callerError is a call its caller gave up on.
type callerError struct{ err error }

func (e *callerError) Error() string {
	return "shared store call abandoned by its caller: " + e.err.Error()
}

func (e *callerError) Unwrap() error { return e.err }

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
	next enforcement.Authority
	// nextHeeds: next.Take returns as soon as its context is done, so Take
	// needs no goroutine of its own to stop waiting (see HeedsCancel).
	nextHeeds bool
	s         Settings
	cb        *gobreaker.CircuitBreaker[struct{}]
	obs       Observer
	lag       *lagMonitor
}

var _ enforcement.Authority = (*Authority)(nil)

// New wraps next. obs and log may be nil. next may be nil for an Authority
// used only through Do.
func New(next enforcement.Authority, s Settings, obs Observer, log *slog.Logger) *Authority {
	s = s.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, heeds := next.(HeedsCancel)
	a := &Authority{next: next, nextHeeds: heeds, s: s, obs: obs, lag: processLag}
	a.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "shared-store",
		MaxRequests: s.Probes,
		Timeout:     s.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= s.ConsecutiveFailures },
		// A caller that went away is not the store's fault.
		IsExcluded: func(err error) bool {
			var ce *callerError
			return errors.As(err, &ce)
		},
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

// HeedsCancel is implemented by an Authority whose Take returns as soon as
// its context is done (redisstore.Pipelined). The guard then runs its Take
// in the caller's goroutine; any other Authority's Take runs in a goroutine
// of its own, as Do's fn does, so that the guard can stop waiting for it.
type HeedsCancel interface {
	enforcement.Authority
	HeedsCancel()
}

// Take implements enforcement.Authority: next.Take under the same deadline
// and breaker as Do.
func (a *Authority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	var v enforcement.Verdict
	err := a.do(ctx, a.nextHeeds, func(ctx context.Context) error {
		var err error
		v, err = a.next.Take(ctx, key, scope, lim, cost)
		return err
	})
	if err != nil {
		return enforcement.Verdict{}, err
	}
	return v, nil
}

// Do runs one store call, fn, under the guard's deadline and breaker: the
// same ones Take uses, so that every call to the store, whatever its
// purpose, is fenced alike and counts towards the same breaker. fn's ctx
// carries the deadline MaxWait (or the caller's, when sooner) and is
// canceled when the guard judges the store late; Do returns then, without
// waiting for fn, whose result is dropped (fn runs in a goroutine of its
// own, and must return by its ctx's deadline).
//
// The error is nil, or satisfies ErrStoreUnavailable (the store failed, was
// late, or the breaker is open: fn was not called), or is the caller's own
// (ctx canceled or past its deadline; not counted against the store).
func (a *Authority) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return a.do(ctx, false, fn)
}

// do is Do; inline runs fn in the caller's goroutine (fn returns as soon as
// its ctx is done).
func (a *Authority) do(ctx context.Context, inline bool, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return &callerError{err}
	}
	_, err := a.cb.Execute(func() (struct{}, error) { return struct{}{}, a.call(ctx, inline, fn) })
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gobreaker.ErrOpenState):
		return &storeError{msg: "circuit breaker open"}
	case errors.Is(err, gobreaker.ErrTooManyRequests):
		return &storeError{msg: "circuit breaker half-open, probes in flight"}
	}
	return err
}

// call is one store call: fn under a watch that cancels it when the store
// is judged late.
func (a *Authority) call(parent context.Context, inline bool, fn func(ctx context.Context) error) error {
	start := time.Now()
	a.lag.enter()
	defer a.lag.exit()
	w := &watch{a: a, start: start, deadline: start.Add(a.s.MaxWait)}
	if d, ok := parent.Deadline(); ok && d.Before(w.deadline) {
		w.deadline = d
	}
	w.Context, w.cancel = context.WithCancel(parent)
	w.mu.Lock()
	w.timer = time.AfterFunc(a.s.Timeout, w.judge)
	w.mu.Unlock()
	// Unless fn is known to return as soon as its ctx is done (inline), it
	// runs in a goroutine of its own so that the call ends when the guard
	// gives up on it even if fn would not (a go-redis read heeds only its
	// context's deadline, MaxWait, not an earlier cancellation). That
	// goroutine ends when fn returns, by MaxWait at the latest; its result
	// is then dropped.
	var err error
	if inline {
		err = fn(w)
	} else {
		res := make(chan error, 1)
		go func() { res <- fn(w) }()
		select {
		case err = <-res:
		case <-w.Done():
			select {
			case err = <-res: // answered as it was given up on: take the answer
			default:
				err = w.Err()
			}
		}
	}
	w.mu.Lock()
	w.done = true
	w.timer.Stop()
	w.mu.Unlock()
	w.cancel()
	took := time.Since(start)

	if err != nil && parent.Err() != nil {
		return &callerError{parent.Err()} // not a store call's outcome: not observed
	}
	if err != nil {
		if why := w.failed.Load(); why != nil {
			err = &storeError{msg: *why}
		} else {
			err = &storeError{msg: "store call failed", err: err}
		}
	}
	if a.obs != nil {
		a.obs.StoreCall(took, err)
	}
	return err
}

// watch is the context of one store call and the timer that judges it.
type watch struct {
	context.Context // canceled by cancel
	a               *Authority
	start           time.Time
	deadline        time.Time
	cancel          context.CancelFunc
	failed          atomic.Pointer[string] // why the guard gave up on the call

	mu    sync.Mutex
	timer *time.Timer
	done  bool // the call returned: judge no more
}

// Deadline is MaxWait after the start, or the caller's, when sooner.
func (w *watch) Deadline() (time.Time, bool) { return w.deadline, true }

// judge runs when the call has had no reply for Timeout, and again as long
// as the process keeps it waiting.
func (w *watch) judge() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	now := time.Now()
	elapsed := now.Sub(w.start)
	// From Timeout before the call: a process starved just before it sent
	// the call is still catching up.
	st := w.a.lag.since(w.start.Add(-w.a.s.Timeout), now)
	why, recheck := judge(w.a.s, elapsed, st)
	if why != "" {
		w.failed.Store(&why)
		w.cancel()
		return
	}
	w.timer.Reset(recheck)
}

// judge decides a call that has had no reply for elapsed, given what the
// starvation monitor saw meanwhile: it returns why the call fails, or "" and
// when to judge it again.
//
//   - Not starved: the process had the CPU, so the store is late: the call
//     fails at Timeout.
//   - Starved: the call waits on until it has had Timeout + StarvedGrace of
//     time in which this process ran (elapsed minus its scheduler lag).
//   - Never beyond MaxWait.
func judge(s Settings, elapsed time.Duration, st starvation) (why string, recheck time.Duration) {
	if elapsed >= s.MaxWait {
		return fmt.Sprintf("no reply within %v (scheduler lag %v, machine busy %v)", s.MaxWait, st.lag.Round(time.Microsecond), st.busy), 0
	}
	if !st.starved() {
		if elapsed >= s.Timeout {
			return fmt.Sprintf("no reply within %v while the process had the CPU (scheduler lag %v)", s.Timeout, st.lag.Round(time.Microsecond)), 0
		}
		return "", s.Timeout - elapsed
	}
	budget := s.Timeout + s.StarvedGrace
	ran := elapsed - st.lag
	if ran >= budget {
		return fmt.Sprintf("no reply within %v of running time (starved: scheduler lag %v of %v, machine busy %v)", budget, st.lag.Round(time.Microsecond), elapsed.Round(time.Microsecond), st.busy), 0
	}
	return "", max(lagTick, min(budget-ran, s.MaxWait-elapsed))
}
