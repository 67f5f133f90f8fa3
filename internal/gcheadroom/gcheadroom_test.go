package gcheadroom_test

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/gcheadroom"
)

const mib = 1 << 20

func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		name                string
		scannable, headroom uint64
		floor, want         int
	}{
		{"a small heap gets the headroom", 8 * mib, 64 * mib, 100, 800},
		{"rounded up, never less than the headroom", 3 * mib, 64 * mib, 100, 2134},
		{"a heap larger than the headroom keeps the floor", 640 * mib, 64 * mib, 100, 100},
		{"the operator's higher floor stands", 8 * mib, 64 * mib, 1000, 1000},
		{"headroom 0 is off", 8 * mib, 0, 100, 100},
		{"nothing measured yet", 0, 64 * mib, 100, 100},
		{"a tiny heap is clamped to an int32", 1, 1 << 40, 100, 1<<31 - 1},
	} {
		if got := gcheadroom.Percent(tc.scannable, tc.headroom, tc.floor); got != tc.want {
			t.Errorf("%s: Percent(%d, %d, %d) = %d, want %d", tc.name, tc.scannable, tc.headroom, tc.floor, got, tc.want)
		}
	}
}

// gogc is the collector's GOGC as the runtime reports it.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// collectUntil runs collections until ok holds (the hook runs on the
// finalizer goroutine after a cycle, so it is waited for, not assumed).
func collectUntil(t *testing.T, what string, ok func(int) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok(gogc()) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for GOGC to be %s; it is %d", what, gogc())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

var retained []byte

func TestRunFollowsTheLiveHeapAndRestoresTheFloor(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	const headroom = 32 * mib
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gcheadroom.Run(ctx, headroom, 100)
	}()

	// A test binary's heap is a few MB: the headroom is the larger term.
	collectUntil(t, "raised above 100 for a small heap", func(p int) bool { return p > 300 })

	// A live heap four times the headroom: the next cycle falls back to the floor.
	retained = make([]byte, 4*headroom)
	for i := range retained {
		retained[i] = 1
	}
	collectUntil(t, "back at 100 with 128 MiB live", func(p int) bool { return p == 100 })

	// Released: raised again.
	retained = nil
	collectUntil(t, "raised again once the heap is small", func(p int) bool { return p > 300 })

	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its context's end")
	}
	if p := gogc(); p != 100 {
		t.Errorf("GOGC %d after Run returned, want the floor 100", p)
	}
	// Stopped: a later cycle leaves GOGC alone.
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	if p := gogc(); p != 100 {
		t.Errorf("GOGC %d after a cycle once Run returned, want 100", p)
	}
}
