package lifecycle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder notes what happens, in order.
type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.log, " ")
}

// worker is a component that notes its stop and returns ctx's error.
func worker(r *recorder, name string, started *sync.WaitGroup) func(ctx context.Context) error {
	started.Add(1)
	return func(ctx context.Context) error {
		started.Done()
		<-ctx.Done()
		r.note("stop:" + name)
		return ctx.Err()
	}
}

func TestGroupStopsInReverseOrder(t *testing.T) {
	var r recorder
	var started sync.WaitGroup
	var g Group
	g.OnStop("client", func(context.Context) error { r.note("close:client"); return nil })
	g.Add("store", worker(&r, "store", &started))
	g.Add("emitter", worker(&r, "emitter", &started))
	serving := make(chan struct{})
	g.Server("http", func() error { <-serving; r.note("served:http"); return nil },
		func(context.Context) error { r.note("shutdown:http"); close(serving); return nil })
	g.Add("task", func(context.Context) error { return nil }) // done at once: the others keep running

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- g.Run(ctx, time.Minute) }()
	started.Wait()
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	const want = "shutdown:http served:http stop:emitter stop:store close:client"
	if got := r.String(); got != want {
		t.Fatalf("stop order:\n got %s\nwant %s", got, want)
	}
}

func TestGroupFailureStopsTheOthers(t *testing.T) {
	var r recorder
	var started sync.WaitGroup
	var g Group
	g.Add("store", worker(&r, "store", &started))
	boom := errors.New("boom")
	g.Add("broken", func(context.Context) error { started.Wait(); return boom })
	g.Add("emitter", worker(&r, "emitter", &started))

	err := g.Run(context.Background(), time.Minute) // ends by the failure alone
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "broken: boom") {
		t.Fatalf("Run = %v, want the failure named", err)
	}
	if got, want := r.String(), "stop:emitter stop:store"; got != want {
		t.Fatalf("stop order: got %q, want %q", got, want)
	}
}

func TestGroupLeavesBehindWhatOutlivesTheGrace(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var r recorder
	var started sync.WaitGroup
	var g Group
	g.Add("store", worker(&r, "store", &started))
	started.Add(1)
	g.Add("stuck", func(context.Context) error { started.Done(); <-release; return nil })

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- g.Run(ctx, 50*time.Millisecond) }()
	started.Wait()
	cancel()
	err := <-errc
	if err == nil || !strings.Contains(err.Error(), "stuck did not stop within 50ms") {
		t.Fatalf("Run = %v, want the stuck component named", err)
	}
}

func TestGroupReportsStopErrors(t *testing.T) {
	var g Group
	g.OnStop("client", func(context.Context) error { return errors.New("close failed") })
	g.Add("fails-late", func(ctx context.Context) error { <-ctx.Done(); return errors.New("flush failed") })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := g.Run(ctx, time.Minute)
	for _, want := range []string{"fails-late: flush failed", "client: stop: close failed"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Run = %v, want %q in it", err, want)
		}
	}
}

// TestReleaseStopsWithoutRunning: a start that failed releases what was
// registered (stops, newest first) and runs nothing.
func TestReleaseStopsWithoutRunning(t *testing.T) {
	var g Group
	r := &recorder{}
	g.OnStop("tracer", func(context.Context) error { r.note("tracer"); return nil })
	g.Add("worker", func(context.Context) error { r.note("ran"); return nil })
	g.OnStop("client", func(context.Context) error { r.note("client"); return errors.New("refused") })
	g.Server("server", func() error { r.note("served"); return nil }, func(context.Context) error { r.note("server"); return nil })
	cause := errors.New("listen failed")
	err := g.Release(cause, time.Second)
	if got := r.String(); got != "server client tracer" {
		t.Fatalf("released %q, want server client tracer", got)
	}
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "client: release: refused") {
		t.Fatalf("error %v", err)
	}
}
