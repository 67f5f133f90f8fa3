package enforcement

import "time"

// Design (issue 15): the limiter's clock. Every decision reads it once, and
// on the local tier's rejection path (a flood) the read was a quarter of the
// decision's cost: time.Now reads two clocks, the wall clock and the
// monotonic one. The buckets need only elapsed time, which the monotonic
// clock alone gives: time.Since of a time carrying a monotonic reading is
// one read (about a third of time.Now's cost on the benchmark VM,
// BENCHMARKS.md). The wall times a decision reports (ResetAt, the time a
// decision is recorded and evaluated at) are that monotonic reading placed
// on an anchor, a (wall, monotonic) pair the limiter's own goroutine re-reads
// every anchorEvery, so a step of the machine's wall clock shows in them
// within that period; between re-reads both clocks advance at the same
// (NTP-disciplined) rate.
//
// Nothing is stale: every decision still reads the clock exactly, so a
// retry time is never later than the truth. A coarse clock (an atomic
// advanced by a ticker goroutine) was measured too and rejected: it reads in
// about 1 ns, but it is behind by up to a tick, and on a loaded machine by
// however long the ticker goroutine waits for a CPU beyond that, which makes
// a local rejection's retry time late by as much and can reject a request
// that the true time would allow. Reading the CPU's time-stamp counter
// directly was measured as well (2026-11-30, this VM: RDTSC about 14 ns,
// RDTSCP 34, time.Since 42, time.Now 150): it would save about 25 ns a
// decision, but it is not the kernel's clock. Its rate would be our own
// calibration, blind to NTP's slewing, and a VM migration can step it.
// Then a retry time could be early or late with nothing to detect it.
// The monotonic read stays: what a local rejection costs beyond it is the
// table lookup and the decision itself (limiter.go, table.go).
//
// An injected Config.Now (tests stepping time, including backwards) is read
// on every decision as before and its readings are the wall times.

// anchorEvery is how often the default clock's wall anchor is re-read.
const anchorEvery = time.Second

// reading is one read of the limiter's clock.
type reading struct {
	off  time.Duration // since the epoch: monotonic with the default clock
	wall time.Time     // the injected clock's reading; zero with the default clock
}

// wallAnchor places monotonic offsets on the wall clock.
type wallAnchor struct {
	wall time.Time     // a wall-clock reading, without its monotonic part
	off  time.Duration // the monotonic offset from the epoch at the same instant
}

func (l *Limiter) startClock() {
	if l.cfg.Now != nil {
		l.epoch = l.cfg.Now()
		return
	}
	l.epoch = time.Now()
	l.anchor.Store(&wallAnchor{wall: l.epoch.Round(0)})
}

// read reads the clock: one monotonic read with the default clock.
func (l *Limiter) read() reading {
	if l.cfg.Now != nil {
		t := l.cfg.Now()
		return reading{off: t.Sub(l.epoch), wall: t}
	}
	return reading{off: time.Since(l.epoch)}
}

// wall is the wall time of a reading.
func (l *Limiter) wall(r reading) time.Time {
	if l.cfg.Now != nil {
		return r.wall
	}
	a := l.anchor.Load()
	return a.wall.Add(r.off - a.off)
}

// wallAfter is the wall time d after a reading (one time.Time addition).
func (l *Limiter) wallAfter(r reading, d time.Duration) time.Time {
	if l.cfg.Now != nil {
		return r.wall.Add(d)
	}
	a := l.anchor.Load()
	return a.wall.Add(r.off - a.off + d)
}

// elapsed is the time since r, for the decision-latency observation.
func (l *Limiter) elapsed(r reading) time.Duration {
	if l.cfg.Now != nil {
		return max(0, time.Since(r.wall))
	}
	return max(0, time.Since(l.epoch)-r.off)
}

// reanchor re-reads the wall clock against the monotonic one.
func (l *Limiter) reanchor() {
	if l.cfg.Now != nil {
		return
	}
	t := time.Now()
	l.anchor.Store(&wallAnchor{wall: t.Round(0), off: t.Sub(l.epoch)})
}
