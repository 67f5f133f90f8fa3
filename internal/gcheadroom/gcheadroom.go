// Package gcheadroom spaces out the garbage collections of a process whose
// live heap is small next to what it allocates: it raises GOGC so that at
// least a fixed number of bytes can be allocated between two collections,
// and never lowers it below the process's own setting.
//
// Why: a collection's fixed costs (its phases, scanning every goroutine's
// stack, the mark assists it puts on allocating goroutines) are paid per
// cycle, and Go's default GOGC=100 starts a cycle each time the heap has
// grown by as much as is live. The limiter's live heap is a few megabytes
// (about 11 MB under a 10,000-key load) while every /check allocates about
// 4 KB, most of it net/http's, so at GOGC=100 it collected several times a
// second; a fixed headroom of tens of megabytes collects about once a
// second at the same rate, and costs at most that much memory. As the live
// heap grows the headroom becomes the smaller term and GOGC falls back to
// the process's own (a heap of a million keys is not given five times its
// size). GOMEMLIMIT, when the operator sets it, still bounds the whole.
//
// The collector is tuned after each cycle, from the runtime's own account
// of what the cycle found live (runtime/metrics), so a heap that grows
// quickly is re-tuned at its next collection, not a period later.
package gcheadroom

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Percent is the GOGC that lets the heap grow by at least headroom bytes
// past the last collection's scannable size (live heap, stacks and
// globals: what Go's heap goal is a percentage of), and never less than
// floor, the process's own GOGC.
func Percent(scannable, headroom uint64, floor int) int {
	if scannable == 0 || headroom == 0 {
		return floor
	}
	p := math.Ceil(float64(headroom) * 100 / float64(scannable))
	if p <= float64(floor) {
		return floor
	}
	if p > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(p)
}

// samples are the runtime metrics the tuner reads.
var sampleNames = [...]string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// scannable reads the last collection's live heap plus stacks and globals.
func scannable(s []metrics.Sample) uint64 {
	metrics.Read(s)
	var n uint64
	for _, v := range s {
		if v.Value.Kind() == metrics.KindUint64 {
			n += v.Value.Uint64()
		}
	}
	return n
}

// Run keeps GOGC at Percent(scannable, headroom, floor) after every
// collection until ctx is done, then restores floor, and returns. floor is
// the GOGC the process runs with otherwise (100 unless the operator set
// one). The value in effect is the runtime's metric /gc/gogc:percent
// (go_gc_gogc_percent from Prometheus's Go collector).
//
// The hook is a finalizer re-armed each cycle (the runtime runs it after
// the collection that finds its object unreachable), so no goroutine of
// Run's own polls; Run waits on ctx and stops the hook when it is done.
func Run(ctx context.Context, headroom uint64, floor int) {
	t := &tuner{headroom: headroom, floor: floor, set: floor,
		samples: make([]metrics.Sample, len(sampleNames))}
	for i, name := range sampleNames {
		t.samples[i].Name = name
	}
	t.cycle()
	<-ctx.Done()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	debug.SetGCPercent(floor)
}

type tuner struct {
	headroom uint64
	floor    int

	mu      sync.Mutex // Run's first tune and its stop against the hook
	stopped bool
	samples []metrics.Sample
	set     int // the GOGC last set
}

// sentinel is the object whose finalizer marks the end of a cycle. It
// holds a pointer, so the allocator never batches it with other small
// objects (a finalizer there may never run) and it is never zero-size.
type sentinel struct{ t *tuner }

// cycle tunes for the collection that just ended and arms the hook for the
// next one.
func (t *tuner) cycle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	if p := Percent(scannable(t.samples), t.headroom, t.floor); p != t.set {
		debug.SetGCPercent(p)
		t.set = p
	}
	runtime.SetFinalizer(&sentinel{t}, func(s *sentinel) { s.t.cycle() })
}
