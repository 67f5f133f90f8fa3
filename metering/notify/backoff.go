package notify

import (
	"fmt"
	"time"
)

// Schedule is the retry policy of one notification: attempt n (1-based)
// that fails is followed, if n < Attempts, by a wait of
//
//	d = min(Base × 2^(n-1), Max);  wait = d/2 + jitter × d/2,  jitter ∈ [0, 1)
//
// ("equal jitter": at least half the exponential step, so receivers that
// recover get a spread of retries but never a burst). The zero value means
// DefaultSchedule.
type Schedule struct {
	Base     time.Duration
	Max      time.Duration
	Attempts int // total attempts, including the first
}

// DefaultSchedule is the schedule of the zero Schedule: 8 attempts; waits
// of 1–2 s, 2–4 s, 4–8 s, 8–16 s, 16–32 s, 32–64 s, 64–128 s between them
// (at most about 4 min 14 s in all).
func DefaultSchedule() Schedule {
	return Schedule{Base: 2 * time.Second, Max: 5 * time.Minute, Attempts: 8}
}

func (s Schedule) orDefault() Schedule {
	if s == (Schedule{}) {
		return DefaultSchedule()
	}
	return s
}

func (s Schedule) validate() error {
	if s.Base <= 0 || s.Max < s.Base || s.Attempts < 1 || s.Attempts > 30 {
		return fmt.Errorf("retry schedule needs 0 < Base ≤ Max and 1 ≤ Attempts ≤ 30, got %+v", s)
	}
	return nil
}

// Wait is the pause after failed attempt n (1-based), with jitter in [0, 1).
func (s Schedule) Wait(n int, jitter float64) time.Duration {
	d := s.Base
	for i := 1; i < n && d < s.Max; i++ {
		d *= 2
	}
	if d > s.Max {
		d = s.Max
	}
	return d/2 + time.Duration(jitter*float64(d/2))
}
