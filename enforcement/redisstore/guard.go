package redisstore

// Design: the guard puts a deadline and a circuit breaker on every call to the
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
//
// The call's context is the guard's own, not a child of the caller's (a
// child made net/http's request context allocate on every request): it
// carries the caller's values and the earlier of the
// caller's deadline and MaxWait, and is canceled by the judge, which also
// ends the call when it finds the caller gone — at Timeout (then at each
// re-judgement) or at the caller's own deadline, whichever comes first.

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

// GuardSettings tune the guard. The zero value of each field is its documented default.
type GuardSettings struct {
	// Timeout is the deadline of one store call (default 5ms: within the
	// limiter's latency budget, well above a healthy loopback or
	// same-datacentre round trip). A call with no reply after Timeout, while
	// this process was running, is a store failure.
	Timeout time.Duration
	// StarvedGrace is the extra time a call may wait when this process was
	// starved of CPU during it (default DefaultStarvedGrace). The call fails once it has
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

// DefaultStarvedGrace is GuardSettings.StarvedGrace's default: the room a
// store call has beyond its Timeout on a machine short of CPU. The
// limiter's global decisions get the same room (their deadline is the
// store timeout plus this).
const DefaultStarvedGrace = 100 * time.Millisecond

func (s GuardSettings) withDefaults() GuardSettings {
	if s.Timeout <= 0 {
		s.Timeout = 5 * time.Millisecond
	}
	if s.StarvedGrace <= 0 {
		s.StarvedGrace = DefaultStarvedGrace
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
	msg  string
	err  error // nil, or the cause (never a context error: see Unwrap)
	open bool  // the breaker refused the call: enforcement.ErrBreakerOpen
}

func (e *storeError) Error() string {
	if e.err == nil {
		return "shared store unavailable: " + e.msg
	}
	return "shared store unavailable: " + e.msg + ": " + e.err.Error()
}

func (e *storeError) Is(target error) bool {
	return target == ErrStoreUnavailable || (e.open && target == enforcement.ErrBreakerOpen)
}

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

// Guard is an enforcement.Authority behind a deadline and a breaker: one
// shard's fence (Shared keeps one per shard).
type Guard struct {
	next enforcement.Authority
	// nextHeeds: next.Take returns as soon as its context is done, so Take
	// needs no goroutine of its own to stop waiting (see HeedsCancel).
	nextHeeds bool
	s         GuardSettings
	cb        *gobreaker.CircuitBreaker[struct{}]
	obs       Observer
	lag       *lagMonitor
}

var _ enforcement.Authority = (*Guard)(nil)

// NewGuard wraps next with a guard that has its own starvation monitor
// (Run runs it). obs and log may be nil. next may be nil for a Guard used
// only through Do. It starts nothing: until Run runs the monitor has no
// history, and a late call is judged as in a process just started (it
// fails after Timeout + StarvedGrace rather than Timeout).
func NewGuard(next enforcement.Authority, s GuardSettings, obs Observer, log *slog.Logger) *Guard {
	return newGuard(next, s, obs, log, newLagMonitor(lagTick, lagSlack, lagHistory))
}

// Run runs the guard's starvation monitor until ctx ends (a Guard made by
// Shared has Shared's, which Shared.Run runs). It returns nil once its
// probe has stopped.
func (a *Guard) Run(ctx context.Context) error { return a.lag.run(ctx) }

// newGuard is NewGuard with the monitor of lag, shared by every guard of
// one store.
func newGuard(next enforcement.Authority, s GuardSettings, obs Observer, log *slog.Logger, lag *lagMonitor) *Guard {
	s = s.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, heeds := next.(HeedsCancel)
	a := &Guard{next: next, nextHeeds: heeds, s: s, obs: obs, lag: lag}
	a.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "shared-store",
		MaxRequests: s.Probes,
		Timeout:     s.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= s.ConsecutiveFailures },
		// A caller that went away is not the store's fault.
		IsExcluded: func(err error) bool {
			_, gone := err.(*callerError) // the guard's own error, never wrapped
			return gone
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
func (a *Guard) State() State { return stateOf(a.cb.State()) }

// HeedsCancel is implemented by an Authority whose Take returns as soon as
// its context is done (redisstore.Pipelined), and which does not use that
// context after Take returned unless the context was done by then. The
// guard then runs its Take in the caller's goroutine, with a call context
// it reuses for a later call; any other Authority's Take runs in a
// goroutine of its own, as Do's fn does, so that the guard can stop waiting
// for it.
type HeedsCancel interface {
	enforcement.Authority
	HeedsCancel()
}

// Take implements enforcement.Authority: next.Take under the same deadline
// and breaker as Do.
func (a *Guard) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	if !a.nextHeeds {
		var v enforcement.Verdict
		err := a.do(ctx, func(ctx context.Context) error {
			var err error
			v, err = a.next.Take(ctx, key, scope, lim, cost)
			return err
		})
		if err != nil {
			return enforcement.Verdict{}, err
		}
		return v, nil
	}
	// The hot path: next.Take in this goroutine, under a reused
	// watch, with no closure or result that escapes to the heap.
	if err := ctx.Err(); err != nil {
		return enforcement.Verdict{}, &callerError{err}
	}
	var v enforcement.Verdict
	_, err := a.cb.Execute(func() (struct{}, error) {
		w := a.begin(ctx, true)
		var err error
		v, err = a.next.Take(w, key, scope, lim, cost)
		return struct{}{}, a.end(w, err)
	})
	if err != nil {
		return enforcement.Verdict{}, a.breakerError(err)
	}
	return v, nil
}

// Do runs one store call, fn, under the guard's deadline and breaker: the
// same ones Take uses, so that every call to the store, whatever its
// purpose, is fenced alike and counts towards the same breaker. fn's ctx
// carries the deadline MaxWait (or the caller's, when sooner) and is
// canceled when the guard judges the store late, or, within Timeout, when
// the caller's ctx ends; Do returns then, without waiting for fn, whose
// result is dropped (fn runs in a goroutine of its own, and must return by
// its ctx's deadline).
//
// The error is nil, or satisfies ErrStoreUnavailable (the store failed, was
// late, or the breaker is open: fn was not called), or is the caller's own
// (ctx canceled or past its deadline; not counted against the store).
func (a *Guard) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return a.do(ctx, fn)
}

// DoHeeding is Do for an fn that returns as soon as its ctx is done and
// does not use ctx once it returned unless ctx was done by then (a call of
// redisstore.Pipelined's, as Take's hot path): fn runs on the caller's
// goroutine, under a reused call context.
func (a *Guard) DoHeeding(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return &callerError{err}
	}
	_, err := a.cb.Execute(func() (struct{}, error) {
		w := a.begin(ctx, true)
		return struct{}{}, a.end(w, fn(w))
	})
	if err != nil {
		return a.breakerError(err)
	}
	return nil
}

// do is Do: fn in a goroutine of its own.
func (a *Guard) do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return &callerError{err}
	}
	_, err := a.cb.Execute(func() (struct{}, error) {
		w := a.begin(ctx, false)
		// fn runs in a goroutine of its own so that the call ends when the
		// guard gives up on it even if fn would not (a go-redis read heeds
		// only its context's deadline, MaxWait, not an earlier
		// cancellation). That goroutine ends when fn returns, by MaxWait at
		// the latest; its result is then dropped.
		res := make(chan error, 1)
		go func() { res <- fn(w) }()
		var err error
		select {
		case err = <-res:
		case <-w.Done():
			select {
			case err = <-res: // answered as it was given up on: take the answer
			default:
				err = w.Err()
			}
		}
		return struct{}{}, a.end(w, err)
	})
	if err != nil {
		return a.breakerError(err)
	}
	return nil
}

// breakerError is the error of a call the breaker refused, or the call's own.
func (a *Guard) breakerError(err error) error {
	switch {
	case errors.Is(err, gobreaker.ErrOpenState):
		return &storeError{msg: "circuit breaker open", open: true}
	case errors.Is(err, gobreaker.ErrTooManyRequests):
		return &storeError{msg: "circuit breaker half-open, probes in flight"}
	}
	return err
}

// watches recycles the call contexts of Take's hot path (see watch).
var watches = sync.Pool{New: func() any { return &watch{done: make(chan struct{})} }}

// begin starts one store call: its context, under a watch that cancels it
// when the store is judged late or the caller is gone. reuse: the watch
// comes from the pool and goes back to it after end, when nothing can
// still use it.
func (a *Guard) begin(parent context.Context, reuse bool) *watch {
	var w *watch
	if reuse {
		w = watches.Get().(*watch)
	} else {
		w = &watch{done: make(chan struct{})}
	}
	w.a, w.parent, w.reuse = a, parent, reuse
	w.start = time.Now()
	a.lag.enter()
	w.deadline = w.start.Add(a.s.MaxWait)
	first := a.s.Timeout
	if d, ok := parent.Deadline(); ok {
		w.callerDeadline = d
		if d.Before(w.deadline) {
			w.deadline = d
		}
		first = min(first, d.Sub(w.start))
	}
	// Not context.WithCancel(parent): registering with the caller's
	// context made net/http's request context allocate a map of children
	// on every request, and a cancelCtx and its channel besides.
	// The caller's end is seen by the judge instead, within Timeout (or at
	// the caller's deadline), which is when a store call is late anyway.
	w.mu.Lock()
	w.finished = false
	if w.timer == nil {
		w.timer = time.AfterFunc(first, w.judge)
	} else {
		w.timer.Reset(first)
	}
	w.mu.Unlock()
	return w
}

// end finishes a call begun with begin, whose fn returned err (or was given
// up on), and says what it was: nil, a store failure, or the caller's.
func (a *Guard) end(w *watch, err error) error {
	w.mu.Lock()
	w.finished = true
	stopped := w.timer.Stop()
	w.mu.Unlock()
	a.lag.exit()
	took := time.Since(w.start)
	canceled := w.canceled.Load()

	if err != nil {
		if cause := w.callerGone.Load(); cause != nil {
			err = &callerError{*cause} // not a store call's outcome: not observed
		} else if perr := w.parent.Err(); perr != nil {
			err = &callerError{perr}
		} else if why := w.failed.Load(); why != nil {
			err = &storeError{msg: *why}
		} else {
			err = &storeError{msg: "store call failed", err: err}
		}
	}
	if _, gone := err.(*callerError); !gone && a.obs != nil {
		a.obs.StoreCall(took, err)
	}
	// Back to the pool only when nothing can use the watch any more: its
	// timer was stopped before it fired (so judge is not running on it),
	// and it was not canceled (a canceled call may still be held by the
	// store, and its channel is closed).
	if w.reuse && stopped && !canceled {
		w.a, w.parent = nil, nil
		w.callerDeadline = time.Time{}
		w.failed.Store(nil)
		w.callerGone.Store(nil)
		watches.Put(w)
	}
	return err
}

// watch is the context of one store call and the timer that judges it. It
// is its own context rather than a child of the caller's: Done is closed
// only by the guard (cancel), Err is nil until then, Value is the caller's,
// and the deadline is MaxWait after the start or the caller's, when sooner.
// A watch of Take's hot path is reused for a later call (watches), with its
// timer and its channel, once the call ended without either firing.
type watch struct {
	a              *Guard
	parent         context.Context
	reuse          bool
	start          time.Time
	deadline       time.Time
	callerDeadline time.Time // the caller's deadline, zero if none
	done           chan struct{}
	canceled       atomic.Bool
	err            error                  // set before done is closed
	failed         atomic.Pointer[string] // why the guard gave up on the call
	callerGone     atomic.Pointer[error]  // the caller's error, when the judge saw it gone

	mu       sync.Mutex
	timer    *time.Timer
	finished bool // the call returned: judge no more
}

var _ context.Context = (*watch)(nil)

// Deadline is MaxWait after the start, or the caller's, when sooner.
func (w *watch) Deadline() (time.Time, bool) { return w.deadline, true }

// Done is closed when the guard gives up on the call.
func (w *watch) Done() <-chan struct{} { return w.done }

// Err is nil until Done is closed, then why.
func (w *watch) Err() error {
	if !w.canceled.Load() {
		return nil
	}
	return w.err
}

// Value is the caller's.
func (w *watch) Value(key any) any { return w.parent.Value(key) }

// cancel closes Done with err. Called with w.mu held, once.
func (w *watch) cancel(err error) {
	if w.canceled.Load() {
		return
	}
	w.err = err
	w.canceled.Store(true)
	close(w.done)
}

// judge runs when the call has had no reply for Timeout, and again as long
// as the process keeps it waiting.
func (w *watch) judge() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return
	}
	now := time.Now()
	// The caller gone (canceled, or its own deadline passed) is not the
	// store's failure: the call ends with the caller's error.
	if err := w.parent.Err(); err != nil {
		w.callerGone.Store(&err)
		w.cancel(err)
		return
	}
	if !w.callerDeadline.IsZero() && !now.Before(w.callerDeadline) {
		err := context.DeadlineExceeded
		w.callerGone.Store(&err)
		w.cancel(err)
		return
	}
	elapsed := now.Sub(w.start)
	// From Timeout before the call: a process starved just before it sent
	// the call is still catching up.
	st := w.a.lag.since(w.start.Add(-w.a.s.Timeout), now)
	why, recheck := judge(w.a.s, elapsed, st)
	if why != "" {
		w.failed.Store(&why)
		w.cancel(context.Canceled)
		return
	}
	if !w.callerDeadline.IsZero() {
		recheck = min(recheck, w.callerDeadline.Sub(now))
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
func judge(s GuardSettings, elapsed time.Duration, st starvation) (why string, recheck time.Duration) {
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
