// Package lifecycle is the one lifecycle of the binaries' long-lived
// components (README.md, "Code layout"): a constructor starts nothing;
// Run(ctx) does the component's background work until ctx ends and returns
// only after every goroutine it started has returned. A Group runs a
// binary's components under one errgroup and stops them in reverse order of
// Add, all within the shutdown grace; Main is what every binary's serve
// does around it (configuration, JSON logs, SIGTERM and SIGINT).
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ratewarden/ratewarden/internal/redislog"
)

// ShutdownGrace is how long a binary's components have to stop after
// SIGTERM: the contract's 10 s, less a second for the process to exit.
const ShutdownGrace = 9 * time.Second

// Main reads the configuration with load, logs JSON on stderr (go-redis's
// own lines too), and runs run until SIGTERM or SIGINT. It returns the exit
// code: 2 for an invalid configuration (one line on stderr naming the
// problem; also when run returns an error marked Invalid), 1 when run
// fails, 0 after a clean shutdown.
func Main[C any](name string, load func(getenv func(string) string) (C, error), run func(ctx context.Context, cfg C, log *slog.Logger) error) int {
	cfg, err := load(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+": invalid configuration: "+err.Error())
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	redislog.Use(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		var inv invalid
		if errors.As(err, &inv) {
			// Found by run before anything started (a file the
			// configuration names, read first): the configuration's error.
			fmt.Fprintln(os.Stderr, name+": invalid configuration: "+strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "))
			return 2
		}
		log.Error(name+" stopped", "err", err)
		return 1
	}
	return 0
}

// Invalid marks err as a configuration error run found itself (a file
// the configuration names that does not load, read before anything
// starts): Main reports it as it reports load's, on one line with exit 2.
// err should name its variable.
func Invalid(err error) error { return invalid{err} }

type invalid struct{ err error }

func (e invalid) Error() string { return e.err.Error() }
func (e invalid) Unwrap() error { return e.err }

// Group runs components and stops them in reverse order of Add. The zero
// value is ready to use; a Group is run once.
type Group struct {
	parts []part
}

type part struct {
	name string
	// run does the work until its context ends (nil: nothing to run).
	run func(ctx context.Context) error
	// stop, when set, is called first at stop time with what is left of
	// the grace: a server's Shutdown, a client's Close.
	stop func(ctx context.Context) error
}

// Add registers a component: run does its work until its ctx ends and
// returns once every goroutine it started has. A run that returns nil early
// (a task that is done) leaves the others running; one that fails stops
// the group.
func (g *Group) Add(name string, run func(ctx context.Context) error) {
	g.parts = append(g.parts, part{name: name, run: run})
}

// Server registers a component whose work blocks in serve until shutdown
// is called (net/http's Serve and Shutdown, grpc's Serve and GracefulStop):
// at stop time shutdown gets what is left of the grace, then serve's return
// is waited for. serve returning an error before stop time stops the group.
func (g *Group) Server(name string, serve func() error, shutdown func(ctx context.Context) error) {
	g.parts = append(g.parts, part{name: name, run: func(context.Context) error { return serve() }, stop: shutdown})
}

// HTTPServer registers srv serving on ln, with TLS when srv.TLSConfig is
// set (its certificates there): at stop time srv.Shutdown drains the
// requests in flight within what is left of the grace.
func (g *Group) HTTPServer(name string, srv *http.Server, ln net.Listener) {
	g.Server(name, func() error {
		var err error
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve: %w", err)
	}, srv.Shutdown)
}

// OnStop registers release, called in its turn at stop time (so after
// every component added later has stopped) with what is left of the grace:
// the place for closing a client the later components use.
func (g *Group) OnStop(name string, release func(ctx context.Context) error) {
	g.parts = append(g.parts, part{name: name, stop: release})
}

// Release is for a start that fails before Run: it calls, in reverse order
// of registration, the stop of every part registered so far (closing a
// client, a listener, the tracer) without running any, all within grace,
// and returns cause joined with their errors. A component that opens
// something in its constructor registers its release before the next step
// that can fail. The Group is not to be run afterwards.
func (g *Group) Release(cause error, grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	errs := []error{cause}
	for i := len(g.parts) - 1; i >= 0; i-- {
		if p := g.parts[i]; p.stop != nil {
			if err := p.stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: release: %w", p.name, err))
			}
		}
	}
	g.parts = nil
	return errors.Join(errs...)
}

// Run starts the components in the order added, each under a context of
// its own, and waits until ctx ends or one of them fails. Then it stops
// them in reverse order: the last one added first (its stop, then its
// context cancelled, then its return waited for), down to the first, all
// within grace. A component still running when grace has passed is left
// behind (its name is in the error): the process is exiting. The error
// joins every component's, the first failure first; a component told to
// stop that returns context.Canceled has not failed.
func (g *Group) Run(ctx context.Context, grace time.Duration) error {
	eg, failed := errgroup.WithContext(ctx)
	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
		err    error
	}
	rs := make([]*running, len(g.parts))
	for i, p := range g.parts {
		// Not cancelled with ctx: each component is stopped in its turn.
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := &running{cancel: cancel, done: make(chan struct{})}
		rs[i] = r
		if p.run == nil {
			close(r.done)
			continue
		}
		eg.Go(func() error {
			defer close(r.done)
			err := p.run(pctx)
			if err != nil && pctx.Err() != nil && errors.Is(err, context.Canceled) {
				err = nil // told to stop
			}
			if err != nil {
				r.err = fmt.Errorf("%s: %w", p.name, err)
			}
			return r.err
		})
	}
	<-failed.Done()

	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	var stopErrs []error
	for i := len(g.parts) - 1; i >= 0; i-- {
		p, r := g.parts[i], rs[i]
		if p.stop != nil {
			if err := p.stop(stopCtx); err != nil {
				stopErrs = append(stopErrs, fmt.Errorf("%s: stop: %w", p.name, err))
			}
		}
		r.cancel()
		select {
		case <-r.done:
		case <-stopCtx.Done():
			stopErrs = append(stopErrs, fmt.Errorf("%s did not stop within %s", p.name, grace))
		}
	}
	var errs []error
	if stopCtx.Err() == nil {
		// Every component has returned: Wait is immediate.
		if err := eg.Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range rs {
		select {
		case <-r.done:
			if r.err != nil && (len(errs) == 0 || r.err != errs[0]) {
				errs = append(errs, r.err)
			}
		default:
		}
	}
	return errors.Join(append(errs, stopErrs...)...)
}
