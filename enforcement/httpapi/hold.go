package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/slots"
)

// PriorityHeader is the request header the middleware reads a request's
// priority class from, unless Guard.Priority says otherwise.
const PriorityHeader = "Ratewarden-Priority"

// ErrLeaseLost is the cause (context.Cause) of a held request's context
// when its slot's lease was found ended: the slot may be another
// request's now, so the work should stop.
var ErrLeaseLost = errors.New("the request's concurrency slot was lost (its lease ended)")

// releaseDeadline bounds the release after a handler; a release that
// fails leaves the slot to return at its lease's end.
const releaseDeadline = 2 * time.Second

// Hold is Allow for a request that holds a slot of a concurrency limit
// while its handler runs. When the request may proceed it returns the
// request to hand the handler and done, which the caller must run when
// the handler is over — deferred, so that it runs even when the handler
// panics. Between the two, the lease is renewed every
// slots.RenewInterval(TTL); if a renewal finds the lease ended, the
// handler's context is cancelled with cause ErrLeaseLost. done stops the
// renewals and gives the slot back. Without a concurrency limit Hold is
// Allow and done does nothing.
func (g *Guard) Hold(w http.ResponseWriter, r *http.Request) (next *http.Request, done func(), ok bool) {
	d, ok := g.check(w, r, g.request(r))
	if !ok {
		return r, func() {}, false
	}
	next, done = g.hold(r, &d)
	return next, done, true
}

// hold keeps d's slot, if it has one, until done.
func (g *Guard) hold(r *http.Request, d *enforcement.Decision) (next *http.Request, done func()) {
	if d.Lease == "" {
		return r, func() {}
	}
	l, ok := g.Checker.(Leaser)
	if !ok {
		if g.Log != nil {
			g.Log.Error("a slot was taken by a checker that cannot give it back: it returns at its lease's end", "policy", d.Policy)
		}
		return r, func() {}
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		renewLease(ctx, stop, l, d.Lease, g, cancel)
	}()
	lease := d.Lease
	var once sync.Once
	done = func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			// The request's context may be over (the client left); the
			// slot is owed back all the same.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseDeadline)
			defer rcancel()
			if _, err := l.Release(rctx, lease); err != nil && g.Log != nil {
				g.Log.Warn("release after the handler failed: the slot returns at its lease's end", "err", err)
			}
			cancel(nil)
		})
	}
	return r.WithContext(ctx), done
}

// renewLease renews lease every slots.RenewInterval until stop closes; a
// lease found ended cancels the handler's context.
func renewLease(ctx context.Context, stop <-chan struct{}, l Leaser, lease string, g *Guard, cancel context.CancelCauseFunc) {
	every := slots.RenewInterval(l.TTL())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), every)
		_, err := l.Renew(rctx, lease)
		rcancel()
		switch {
		case errors.Is(err, slots.ErrLeaseNotFound):
			cancel(ErrLeaseLost)
			return
		case err != nil && g.Log != nil:
			g.Log.Warn("lease renewal failed; retrying at the next interval", "err", err)
		}
	}
}

// rejection is the 429's error object: its code says which limit refused
// (rate_limited; concurrency_limited for want of a slot; shed for a
// priority class at its share), so that a client, a dashboard or an alert
// tells a backend shedding load from a customer's own limit.
func rejection(d *enforcement.Decision, secs int64) *Error {
	e := &Error{Status: http.StatusTooManyRequests}
	switch d.Reason {
	case enforcement.ReasonConcurrency:
		e.Code, e.Message = "concurrency_limited", fmt.Sprintf("Too many requests in flight. Retry in about %d second%s.", secs, plural(secs))
	case enforcement.ReasonShed:
		e.Code, e.Message = "shed", fmt.Sprintf("Shed under load: this priority class holds its share. Retry in about %d second%s.", secs, plural(secs))
	default:
		e.Code, e.Message = "rate_limited", fmt.Sprintf("Rate limit exceeded. Retry in about %d second%s.", secs, plural(secs))
	}
	return e
}
