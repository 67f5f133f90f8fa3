package lifecycle

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// Every waits d before the first call, never stacks calls behind a slow
// one, and returns when ctx ends, also from inside a long call's wait.
func TestEveryCallsOnTheTickUntilCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		var at []time.Duration
		done := make(chan struct{})
		go func() {
			defer close(done)
			Every(ctx, time.Second, func(context.Context) {
				at = append(at, time.Since(start))
				if len(at) == 2 {
					time.Sleep(2500 * time.Millisecond) // overruns two ticks
				}
			})
		}()
		time.Sleep(5500 * time.Millisecond)
		cancel()
		<-done
		// The slow call overran the ticks at 3 s and 4 s: at most one of
		// them is delivered late (4.5 s), then the tick at 5 s.
		if len(at) < 3 || len(at) > 4 || at[0] != time.Second || at[1] != 2*time.Second {
			t.Fatalf("calls at %v, want 1s 2s, then one or two from 4.5s on", at)
		}
		for _, a := range at[2:] {
			if a < 4500*time.Millisecond || a > 5*time.Second {
				t.Fatalf("calls at %v, want 1s 2s, then one or two from 4.5s on", at)
			}
		}
	})
}

// A wake-up calls fn at once and leaves the ticks where they were.
func TestEveryOrWakeCallsOnAWakeUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		wake := make(chan struct{}, 1)
		var at []time.Duration
		done := make(chan struct{})
		go func() {
			defer close(done)
			EveryOrWake(ctx, time.Second, wake, func(context.Context) { at = append(at, time.Since(start)) })
		}()
		time.Sleep(300 * time.Millisecond)
		wake <- struct{}{}
		time.Sleep(1500 * time.Millisecond)
		cancel()
		<-done
		if len(at) != 2 || at[0] != 300*time.Millisecond || at[1] != time.Second {
			t.Fatalf("calls at %v, want 300ms (the wake-up) and 1s (the tick)", at)
		}
	})
}
