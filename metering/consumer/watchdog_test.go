package consumer

import (
	"testing"
	"time"
)

// A partition is stalled when it has lag and has written nothing for
// StallAfter: the time it spent caught up does not count. A partition
// quiet for longer than StallAfter whose first new messages the probe
// sees before its reader has fetched them is not stalled; one that then
// makes no progress for StallAfter is. The clock is the test's.
func TestStallClockStartsWhenLagAppears(t *testing.T) {
	const after = 20 * time.Second
	var s partState
	t0 := time.Unix(1_000_000, 0)
	s.start(100, nil)
	s.since = t0
	s.seen(100) // caught up

	at := t0.Add(5 * time.Minute) // a quiet spell, far longer than after
	if stalled, lag, _, _ := s.check(at, after); stalled || lag != 0 {
		t.Fatalf("caught up: stalled %v, lag %d", stalled, lag)
	}
	s.seen(180) // new messages, not yet fetched
	at = at.Add(5 * time.Second)
	if stalled, lag, idle, _ := s.check(at, after); stalled || lag != 80 || idle != 5*time.Second {
		t.Fatalf("the first check with lag after a quiet spell: stalled %v, lag %d, idle %v; want not stalled, 80, 5s", stalled, lag, idle)
	}
	at = at.Add(after)
	if stalled, lag, _, _ := s.check(at, after); !stalled || lag != 80 {
		t.Fatalf("lag and no progress for StallAfter: stalled %v, lag %d; want a stall", stalled, lag)
	}
	if s.stallReason() == "" {
		t.Fatal("the stall is not reported")
	}
	if !s.progress(180) {
		t.Fatal("progress did not end the stall")
	}
	at = at.Add(time.Hour)
	if stalled, _, _, _ := s.check(at, after); stalled {
		t.Fatal("caught up after the stall, then quiet: stalled")
	}
}
