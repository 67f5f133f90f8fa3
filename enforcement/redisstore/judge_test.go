package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const ms = time.Millisecond

// The deadline logic on a controlled clock: judge is given the elapsed time
// and what the monitor saw; nothing here sleeps.
func TestJudge(t *testing.T) {
	s := GuardSettings{Timeout: 5 * ms, MaxWait: 210 * ms}.withDefaults() // grace 100ms
	if s.StarvedGrace != 100*ms {
		t.Fatalf("defaults: %+v", s)
	}
	idle := starvation{}
	cases := []struct {
		name     string
		elapsed  time.Duration
		st       starvation
		fail     string // substring of why; "" = wait on
		recheck  time.Duration
		recheck0 bool // recheck not checked
	}{
		{"early wake-up of the timer: wait the rest", 4 * ms, idle, "", 1 * ms, false},
		{"CPU free, no reply at Timeout: the store is late", 5 * ms, idle, "while the process had the CPU", 0, true},
		{"CPU free, long past Timeout", 60 * ms, idle, "while the process had the CPU", 0, true},
		{"the process waited 1ms for CPU: wait until 105ms of running time", 5 * ms, starvation{lag: ms}, "", 101 * ms, false},
		{"starved 40ms of 100ms: 60ms ran, 45ms to go", 100 * ms, starvation{lag: 40 * ms}, "", 45 * ms, false},
		{"starved, but ran the whole budget", 150 * ms, starvation{lag: 45 * ms}, "of running time", 0, true},
		{"busy machine, no lag of its own: budget in wall time", 50 * ms, starvation{busy: true}, "", 55 * ms, false},
		{"busy machine, budget spent", 105 * ms, starvation{busy: true}, "of running time", 0, true},
		{"recheck never beyond MaxWait", 200 * ms, starvation{lag: 150 * ms}, "", 10 * ms, false},
		{"MaxWait ends every wait", 210 * ms, starvation{lag: 200 * ms}, "no reply within 210ms", 0, true},
		{"recheck at least one probe tick", 104900 * time.Microsecond, starvation{busy: true}, "", lagTick, false},
	}
	for _, c := range cases {
		why, recheck := judge(s, c.elapsed, c.st)
		switch {
		case c.fail == "" && why != "":
			t.Errorf("%s: failed (%s), want to wait on", c.name, why)
		case c.fail != "" && !strings.Contains(why, c.fail):
			t.Errorf("%s: why %q, want it to say %q", c.name, why, c.fail)
		case c.fail == "" && !c.recheck0 && recheck != c.recheck:
			t.Errorf("%s: recheck in %v, want %v", c.name, recheck, c.recheck)
		}
	}
}

func TestSettingsDefaults(t *testing.T) {
	s := GuardSettings{Timeout: 50 * ms}.withDefaults()
	if s.MaxWait != time.Second || s.StarvedGrace != 100*ms || s.ConsecutiveFailures != 5 || s.OpenFor != time.Second || s.Probes != 3 {
		t.Fatalf("%+v", s)
	}
	if s := (GuardSettings{Timeout: time.Second, MaxWait: 10 * ms}).withDefaults(); s.MaxWait != time.Second {
		t.Fatalf("MaxWait below Timeout: %v, want Timeout", s.MaxWait)
	}
}

// feed records n wake-ups one tick apart from *at, each over by over(i).
func feed(m *lagMonitor, at *time.Time, n int, over func(i int) time.Duration) {
	for i := range n {
		o := over(i)
		*at = at.Add(m.tick + o)
		m.record(*at, o)
	}
}

func onTime(int) time.Duration { return 60 * time.Microsecond }

// The monitor on a synthetic timeline.
func TestLagMonitor(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	t.Run("no history: busy", func(t *testing.T) {
		m := activeMonitor(ms, 250*time.Microsecond, 8192)
		if st := m.since(base.Add(-5*ms), base); !st.busy || !st.starved() {
			t.Fatalf("%+v", st)
		}
		at := base
		feed(m, &at, 200, onTime) // 200 ms: less than a contention window
		if st := m.since(at.Add(-10*ms), at); !st.busy {
			t.Fatalf("a probe started 200ms ago knows nothing yet: %+v", st)
		}
	})

	t.Run("idle machine: not starved", func(t *testing.T) {
		m := activeMonitor(ms, 250*time.Microsecond, 8192)
		at := base
		feed(m, &at, 2000, onTime)
		st := m.since(at.Add(-10*ms), at)
		if st.starved() || st.lag != 0 {
			t.Fatalf("%+v", st)
		}
	})

	t.Run("one stall during the call", func(t *testing.T) {
		m := activeMonitor(ms, 250*time.Microsecond, 8192)
		at := base
		feed(m, &at, 2000, onTime)
		from := at
		feed(m, &at, 3, func(i int) time.Duration {
			if i == 1 {
				return 5 * ms
			}
			return 60 * time.Microsecond
		})
		st := m.since(from, at)
		if st.lag != 4750*time.Microsecond || st.busy || !st.starved() {
			t.Fatalf("%+v, want lag 4.75ms (5ms over, less the slack), not busy", st)
		}
		// The same stall before the window does not count.
		if st := m.since(at.Add(time.Microsecond), at.Add(time.Microsecond)); st.lag != 0 {
			t.Fatalf("%+v", st)
		}
	})

	t.Run("a wake-up overdue right now counts", func(t *testing.T) {
		m := activeMonitor(ms, 250*time.Microsecond, 8192)
		at := base
		feed(m, &at, 2000, onTime)
		st := m.since(at.Add(-5*ms), at.Add(21*ms)) // the probe has not run for 21 ms
		if st.lag != 19750*time.Microsecond {
			t.Fatalf("%+v, want 19.75ms", st)
		}
	})

	t.Run("busy machine: late wake-ups in the last second", func(t *testing.T) {
		m := activeMonitor(ms, 250*time.Microsecond, 8192)
		at := base
		feed(m, &at, 2000, func(i int) time.Duration {
			if i%10 == 0 {
				return 400 * time.Microsecond // 10% late by a little
			}
			return 60 * time.Microsecond
		})
		st := m.since(at.Add(time.Microsecond), at.Add(time.Microsecond))
		if !st.busy || st.lag != 0 {
			t.Fatalf("%+v", st)
		}
		// A second of quiet makes it idle again.
		feed(m, &at, 1100, onTime)
		if st := m.since(at, at); st.busy {
			t.Fatalf("%+v", st)
		}
	})

	t.Run("history wraps", func(t *testing.T) {
		m := activeMonitor(ms, 250*time.Microsecond, 1500)
		at := base
		feed(m, &at, 5000, onTime)
		if m.n != 1500 || m.since(at.Add(-10*ms), at).starved() {
			t.Fatalf("n %d %+v", m.n, m.since(at.Add(-10*ms), at))
		}
	})
}

// The probe runs while calls are in flight and stops by itself after them.

// activeMonitor is a monitor whose readings count, as while its run runs.
func activeMonitor(tick, slack time.Duration, history int) *lagMonitor {
	m := newLagMonitor(tick, slack, history)
	m.active.Store(true)
	return m
}

// The probe runs while calls are in flight and stops by itself after them;
// run owns it and returns when its context ends.
func TestLagProbeStopsWhenIdle(t *testing.T) {
	m := newLagMonitor(ms, 250*time.Microsecond, 8192)
	m.idleStop = 20 * ms
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = m.run(ctx) }()
	for !m.active.Load() {
		time.Sleep(ms)
	}
	m.enter()
	if !m.isRunning() {
		t.Fatal("not started by a call")
	}
	time.Sleep(10 * ms)
	m.exit()
	deadline := time.Now().Add(testenv.Timeout(10 * time.Second))
	for m.isRunning() {
		if time.Now().After(deadline) {
			t.Fatal("the probe still runs 10s after the last call (it stops 20ms after)")
		}
		time.Sleep(5 * ms)
	}
	m.mu.Lock()
	n := m.n
	m.mu.Unlock()
	if n == 0 {
		t.Fatal("the probe recorded nothing")
	}
	m.enter() // starts again, with fresh history
	defer m.exit()
	if !m.isRunning() {
		t.Fatal("not restarted")
	}
	m.mu.Lock()
	n = m.n
	m.mu.Unlock()
	if n > 2 {
		t.Fatalf("history from before the stop kept: %d samples", n)
	}
	cancel()
	<-ran // run returns when its context ends, probe and all
	if m.isRunning() || m.active.Load() {
		t.Fatal("still running after run returned")
	}
	if st := m.since(time.Now().Add(-time.Second), time.Now()); !st.busy || st.lag != 0 {
		t.Fatalf("with nothing probing there is no history (busy, as just started), and no lag: %+v", st)
	}
	// A probe that has not run since it was started is overdue: lag.
	m2 := activeMonitor(ms, 250*time.Microsecond, 8192)
	started := time.Now()
	m2.restart(started) // as enter does, without the goroutine
	if st := m2.since(started.Add(-5*ms), started.Add(51*ms)); st.lag != 49750*time.Microsecond || !st.starved() {
		t.Fatalf("%+v, want the 50ms the probe is overdue, less the slack", st)
	}
}
