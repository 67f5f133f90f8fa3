package lifecycle

import (
	"context"
	"time"
)

// Every calls fn every d until ctx ends, and returns once fn has returned:
// the loop of a component's periodic work. The first call comes after d,
// not at once (a component that wants one at start calls fn itself first);
// a call that overruns d delays the next instead of stacking them.
func Every(ctx context.Context, d time.Duration, fn func(ctx context.Context)) {
	EveryOrWake(ctx, d, nil, fn)
}

// EveryOrWake is Every that also calls fn when wake receives (a "check
// now", such as a SIGHUP's); a wake-up does not move the next tick.
func EveryOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}, fn func(ctx context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		if ctx.Err() != nil {
			return
		}
		fn(ctx)
	}
}
