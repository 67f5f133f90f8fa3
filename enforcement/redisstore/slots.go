package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotMap says which Redis Cluster master serves each hash slot, from
// CLUSTER SLOTS. It is safe for concurrent use; Refresh replaces the map
// atomically (call it on a timer, or after a failover).
type SlotMap struct {
	rdb    redis.Cmdable
	owners atomic.Pointer[[16384]string]
	loaded atomic.Bool // a refresh has succeeded
}

// NewSlotMap loads the slot owners through rdb (a *redis.ClusterClient or
// any client connected to one node of the cluster). The map is usable even
// when the error is not nil: a cluster unreachable at start leaves every
// slot "unassigned" until Run's next refresh reaches it.
func NewSlotMap(ctx context.Context, rdb redis.Cmdable) (*SlotMap, error) {
	m := &SlotMap{rdb: rdb}
	m.owners.Store(new([16384]string))
	return m, m.Refresh(ctx)
}

// Refresh reloads the slot owners.
func (m *SlotMap) Refresh(ctx context.Context) error {
	slots, err := m.rdb.ClusterSlots(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster slots: %w", err)
	}
	var owners [16384]string
	for _, s := range slots {
		if len(s.Nodes) == 0 || s.Start < 0 || s.End >= len(owners) {
			continue
		}
		for i := s.Start; i <= s.End; i++ {
			owners[i] = s.Nodes[0].Addr // the first node listed is the master
		}
	}
	m.owners.Store(&owners)
	m.loaded.Store(true)
	return nil
}

// Masters is the set of shards that own slots now ("unassigned" included
// while any slot has no owner).
func (m *SlotMap) Masters() map[string]bool {
	out := map[string]bool{}
	for _, o := range m.owners.Load() {
		if o == "" {
			o = "unassigned"
		}
		out[o] = true
	}
	return out
}

// Owner is host:port of the master serving slot, or "unassigned".
func (m *SlotMap) Owner(slot uint16) string {
	if o := m.owners.Load()[slot%16384]; o != "" {
		return o
	}
	return "unassigned"
}

// Run refreshes the map every interval until ctx ends (a failover moves
// slots to another master); until the first refresh succeeds it retries
// every second, so a limiter started before its cluster converges within
// about a second of the cluster coming up. It blocks; the caller owns the
// goroutine. Failed refreshes keep the previous map and are reported to
// onErr (may be nil).
func (m *SlotMap) Run(ctx context.Context, every time.Duration, onErr func(error)) {
	const untilLoaded = time.Second
	for {
		wait := every
		if !m.loaded.Load() {
			wait = min(every, untilLoaded)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
			rctx, cancel := context.WithTimeout(ctx, wait)
			if err := m.Refresh(rctx); err != nil && onErr != nil {
				onErr(err)
			}
			cancel()
		}
	}
}
