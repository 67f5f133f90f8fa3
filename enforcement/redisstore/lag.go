package redisstore

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// CPU starvation: is this process, or the machine it runs on, short of CPU?
//
// One probe goroutine per process sleeps lagTick at a time and records how
// late each wake-up was, and how long it then waited at the back of the run
// queue (runtime.Gosched). That lateness, beyond lagSlack (the timer's own
// imprecision on an idle machine), is scheduler lag: the process wanted a
// CPU and did not get one, whatever the cause (other processes, GC, a full
// run queue). Two readings are taken from it:
//
//   - the lag during one call (from Timeout before it was sent until it is
//     judged): at least starvedLag means this process itself was held up;
//   - contention: the share of wake-ups in the last contentionWindow that
//     were late at all. A sleeping probe wakes promptly on a busy machine
//     more often than not, but a co-located store or the process's busy
//     threads, which run for longer stretches, are held up whenever it is
//     late; a busy machine shows as a share of late wake-ups well above
//     zero, an idle one as none (BENCHMARKS.md, "Store deadline on a
//     starved machine").
//
// The probe runs only while store calls are in flight: the first call
// wakes it, and it goes back to sleep after lagIdleStop without calls, so
// it costs nothing on an idle limiter. Its goroutine is the monitor's run,
// which the store's Run owns: while run is not running (before Run, after
// it) nothing probes and there is no history, which is judged as in a
// process that has just started. Until it has a full window
// of history (just started), contention is unknown and taken as "busy", so
// a process that has just started is never quick to blame the store.

const (
	lagTick     = time.Millisecond
	lagSlack    = 250 * time.Microsecond
	lagIdleStop = 10 * time.Second
	lagHistory  = 8192 // samples kept: at least 8 s of history at lagTick
	// starvedLag is how much lag during one call makes it "starved".
	starvedLag = time.Millisecond
	// contentionWindow and busyShare: the machine is busy when at least
	// busyShare of the wake-ups in the last contentionWindow were late.
	contentionWindow = time.Second
	busyShare        = 0.05
	// minSamples: fewer wake-ups than this in the window = no history yet
	// (or a process frozen for most of it): busy.
	minSamples = 100
)

type lagSample struct {
	at   time.Time     // when the probe woke
	cum  time.Duration // lag accumulated up to then
	late int64         // late wake-ups counted up to then
}

// lagMonitor accumulates scheduler lag. Use newLagMonitor. Methods are safe
// for concurrent use.
type lagMonitor struct {
	tick, slack, idleStop time.Duration

	inflight atomic.Int64
	running  atomic.Bool   // the probe runs (or has been woken)
	active   atomic.Bool   // run is running: a probe can be woken
	wake     chan struct{} // enter wakes run's probe (capacity 1)

	mu    sync.Mutex
	ring  []lagSample // oldest at start, newest at start+n-1 (mod len)
	start int
	n     int
	cum   time.Duration
	late  int64
}

func newLagMonitor(tick, slack time.Duration, history int) *lagMonitor {
	return &lagMonitor{tick: tick, slack: slack, idleStop: lagIdleStop, ring: make([]lagSample, history),
		wake: make(chan struct{}, 1)}
}

// run probes while calls are in flight, until ctx ends. One run at a time
// per monitor.
func (m *lagMonitor) run(ctx context.Context) error {
	m.active.Store(true)
	defer func() {
		m.active.Store(false)
		m.mu.Lock()
		m.n = 0 // history nobody extends says nothing of what follows
		m.mu.Unlock()
	}()
	if m.inflight.Load() > 0 { // calls entered before run: probe for them
		m.wakeUp()
	}
	for {
		select {
		case <-ctx.Done():
			m.running.Store(false)
			return nil
		case <-m.wake:
			if !m.probe(ctx) {
				m.running.Store(false)
				return nil
			}
		}
	}
}

// enter marks a store call in flight, waking the probe if it is not
// running. The hot path is two atomic operations.
func (m *lagMonitor) enter() {
	m.inflight.Add(1)
	if !m.running.Load() && m.active.Load() {
		m.wakeUp()
	}
}

// wakeUp starts a probe unless one runs or has been woken.
func (m *lagMonitor) wakeUp() {
	if m.running.CompareAndSwap(false, true) {
		m.mu.Lock()
		m.restart(time.Now())
		m.mu.Unlock()
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// restart drops the history (from before a stop, it says nothing of now)
// and records the start as the first sample: a probe that does not get to
// run after it is overdue, which counts as lag. Called with m.mu held.
func (m *lagMonitor) restart(at time.Time) {
	m.start, m.n = 0, 1
	m.ring[0] = lagSample{at: at, cum: m.cum, late: m.late}
}

// exit marks a store call done.
func (m *lagMonitor) exit() { m.inflight.Add(-1) }

// isRunning says whether the probe goroutine runs.
func (m *lagMonitor) isRunning() bool { return m.running.Load() }

// probe samples the scheduler's lag until lagIdleStop without calls (it
// returns true) or until ctx ends (false).
func (m *lagMonitor) probe(ctx context.Context) bool {
	timer := time.NewTimer(m.tick)
	defer timer.Stop()
	last := time.Now()
	var idleSince time.Time
	for {
		select {
		case <-timer.C:
		case <-ctx.Done():
			return false
		}
		woke := time.Now()
		// A goroutine woken by its timer runs before the others waiting
		// (runnext): yield to the back of the run queue and count the wait
		// too, as a goroutine woken by the network waits.
		runtime.Gosched()
		now := time.Now()
		m.record(now, woke.Sub(last)-m.tick+now.Sub(woke))
		if m.inflight.Load() > 0 {
			idleSince = time.Time{}
		} else if idleSince.IsZero() {
			idleSince = now
		} else if now.Sub(idleSince) >= m.idleStop {
			m.running.Store(false)
			// A call that entered before the store saw running and did
			// not wake a probe: carry on for it, unless one that entered
			// after has woken a new probe already.
			if m.inflight.Load() == 0 || !m.running.CompareAndSwap(false, true) {
				return true
			}
			idleSince = time.Time{}
		}
		timer.Reset(m.tick)
		last = time.Now()
	}
}

// record adds one wake-up that came over late (negative = early).
func (m *lagMonitor) record(at time.Time, over time.Duration) {
	m.mu.Lock()
	if over > m.slack {
		m.cum += over - m.slack
		m.late++
	}
	s := lagSample{at: at, cum: m.cum, late: m.late}
	if m.n < len(m.ring) {
		m.ring[(m.start+m.n)%len(m.ring)] = s
		m.n++
	} else {
		m.ring[m.start] = s
		m.start = (m.start + 1) % len(m.ring)
	}
	m.mu.Unlock()
}

func (m *lagMonitor) sample(i int) lagSample { return m.ring[(m.start+i)%len(m.ring)] }

// atOrBefore is the index of the newest sample at or before t, or -1.
// Called with m.mu held.
func (m *lagMonitor) atOrBefore(t time.Time) int {
	lo, hi := 0, m.n // first index with at > t, by binary search
	for lo < hi {
		mid := (lo + hi) / 2
		if m.sample(mid).at.After(t) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo - 1
}

// starvation is what the monitor saw.
type starvation struct {
	lag  time.Duration // this process's scheduler lag over the call
	busy bool          // the machine was busy in the last contentionWindow (or no history yet)
}

// starved says whether a call that is late by the clock may be the CPU's
// fault rather than the store's.
func (s starvation) starved() bool { return s.busy || s.lag >= starvedLag }

// since is what the monitor saw from `from` to now: the lag since then
// (including a wake-up that is overdue right now: a process that is not
// running cannot record it), and whether the machine is busy.
func (m *lagMonitor) since(from, now time.Time) starvation {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return starvation{busy: true}
	}
	newest := m.sample(m.n - 1)
	var st starvation
	if over := now.Sub(newest.at) - m.tick; over > m.slack {
		st.lag = over - m.slack
	}
	if i := m.atOrBefore(from); i >= 0 {
		st.lag += newest.cum - m.sample(i).cum
	} else {
		st.lag += newest.cum // before the first sample: all of it counts
	}
	i := m.atOrBefore(now.Add(-contentionWindow))
	if i < 0 {
		st.busy = true // no full window of history yet
		return st
	}
	wakeups := m.n - 1 - i
	if wakeups < minSamples {
		st.busy = true
		return st
	}
	st.busy = float64(newest.late-m.sample(i).late) >= busyShare*float64(wakeups)
	return st
}
