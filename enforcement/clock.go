package enforcement

import "time"

// Design: the limiter's clock. Every decision reads it once, and on the
// local tier's rejection path (a flood) that read is a large part of the
// decision's cost. time.Now reads two clocks, the wall clock and the
// monotonic one; the buckets need only elapsed time, which the monotonic
// clock alone gives (time.Since of a time carrying a monotonic reading is one
// read). The wall times a decision reports (ResetAt, the time a decision is
// recorded and evaluated at) are that monotonic reading placed on an anchor,
// a (wall, monotonic) pair the limiter's own goroutine re-reads every
// anchorEvery, so a step of the machine's wall clock shows in them within
// that period; between re-reads both clocks advance at the same
// (NTP-disciplined) rate.
//
// Every decision still reads the clock exactly, so a retry time is never
// later than the truth. Two cheaper clocks are ruled out on purpose. A
// coarse clock (an atomic advanced by a ticker goroutine) is behind by up to
// a tick, and on a loaded machine by however long the ticker waits for a CPU,
// which makes a local rejection's retry time late and can reject a request
// the true time would allow. The CPU's time-stamp counter is not the
// kernel's clock: its rate would be our own calibration, blind to NTP's
// slewing, and a VM migration can step it, so a retry time could be early or
// late with nothing to detect it.
//
// An injected Config.Now (tests stepping time, including backwards) is read
// on every decision and its readings are the wall times.

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
