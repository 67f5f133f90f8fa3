// Package fleet tells each limiter instance how many instances share the
// load, from a heartbeat in the shared store, so that what is divided by
// the instance count — the tightened limit and quota share while the store
// is down, the local tier, the hot-key threshold — follows the fleet as an
// autoscaler resizes it. A fixed LIMITER_EXPECTED_INSTANCES of 3 in a
// Deployment scaled to 20 would let a Redis outage admit 20 ÷ 3 times the
// limit; with the live count it admits the limit.
//
// The count last read is kept when the store goes away: that is exactly the
// fleet the outage started with. Before the first reading the caller's
// configured count stands.
package fleet

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"
)

// Store records heartbeats and counts live members; *redisstore.Store is one.
type Store interface {
	// Beat records member as alive, forgets members silent for longer than
	// ttl, and returns the live count.
	Beat(ctx context.Context, member string, ttl time.Duration) (int, error)
	// Leave removes member at once and returns the count left.
	Leave(ctx context.Context, member string, ttl time.Duration) (int, error)
}

// Config tunes the heartbeat. The zero value of each field but Member is its
// documented default.
type Config struct {
	// Member names this instance in the fleet (LIMITER_INSTANCE_ID). Required.
	Member string
	// Every is the heartbeat period (default 2s).
	Every time.Duration
	// TTL: a member silent this long is no longer counted (default 3 × Every,
	// so one lost beat does not shrink the fleet).
	TTL time.Duration
	// Timeout is the deadline of one beat (default 1s); the store's guard
	// may impose a shorter one.
	Timeout time.Duration
	// OnCount receives every count read (optional).
	OnCount func(n int)
	// Log receives transitions: count changes, heartbeat failing, recovered.
	Log *slog.Logger
}

// Heartbeat beats for one instance while Run runs. It is safe for
// concurrent use.
type Heartbeat struct {
	store   Store
	cfg     Config
	count   atomic.Int64 // last count read; 0 = none yet
	failing atomic.Bool  // the latest beat failed (each failure is counted by the store's guard)
}

// New returns the heartbeat of cfg.Member in store. It starts nothing: Run
// beats.
func New(store Store, cfg Config) (*Heartbeat, error) {
	if cfg.Member == "" {
		return nil, errors.New("fleet: Config.Member is required")
	}
	if cfg.Every <= 0 {
		cfg.Every = 2 * time.Second
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 3 * cfg.Every
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Heartbeat{store: store, cfg: cfg}, nil
}

// Count is the fleet's size as last read, 0 before the first reading.
func (h *Heartbeat) Count() int { return int(h.count.Load()) }

// Failing reports whether the latest heartbeat failed: the store is not
// answering, whatever the traffic.
func (h *Heartbeat) Failing() bool { return h.failing.Load() }

// Run beats at once and every Every until ctx ends, then leaves the fleet
// (within Timeout), so the others count one fewer at their next beat
// instead of after the TTL. Leaving is a courtesy: when the store cannot be
// told, the others stop counting this instance when its heartbeat TTL
// expires anyway, so that is logged, not returned. Run returns nil.
func (h *Heartbeat) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.Every)
	defer t.Stop()
	for {
		h.beat()
		select {
		case <-ctx.Done():
			h.leave(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
		}
	}
}

func (h *Heartbeat) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Timeout)
	n, err := h.store.Beat(ctx, h.cfg.Member, h.cfg.TTL)
	cancel()
	if err != nil {
		if !h.failing.Swap(true) {
			h.cfg.Log.Warn("fleet heartbeat failed: keeping the last instance count",
				"instances", h.Count(), "err", err)
		}
		return
	}
	if h.failing.Swap(false) {
		h.cfg.Log.Info("fleet heartbeat recovered", "instances", n)
	}
	h.set(n)
}

func (h *Heartbeat) set(n int) {
	if n < 1 {
		return
	}
	if old := h.count.Swap(int64(n)); old != int64(n) {
		h.cfg.Log.Info("fleet size changed", "instances", n, "was", old)
	}
	if h.cfg.OnCount != nil {
		h.cfg.OnCount(n)
	}
}

func (h *Heartbeat) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	if _, err := h.store.Leave(ctx, h.cfg.Member, h.cfg.TTL); err != nil {
		h.cfg.Log.Warn("could not leave the fleet: the others stop counting this instance when its heartbeat expires",
			"err", err, "ttl", h.cfg.TTL)
	}
}
