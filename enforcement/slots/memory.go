package slots

import (
	"context"
	"sync"
	"time"
)

// Memory is a Store in one process: single-node mode's slots, and the
// Gate's degraded ones while the shared store cannot be asked. It follows
// the same rules as the Redis script (expired leases are dropped before
// each operation; a lease not held is neither renewed nor released) on
// its own clock. It is safe for concurrent use; its zero value is not
// usable (NewMemory).
type Memory struct {
	now func() time.Time
	mu  sync.Mutex
	// sets maps a slot set (store, key, scope) to its leases' ends.
	sets map[setID]map[string]time.Time
}

type setID struct{ store, key, scope string }

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-process store on clock now (nil =
// time.Now).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, sets: map[setID]map[string]time.Time{}}
}

// live is the set of s with its expired leases dropped (nil when empty,
// and then forgotten).
func (m *Memory) live(s Slot, now time.Time) map[string]time.Time {
	id := setID{s.Store, s.Key, s.Scope}
	set := m.sets[id]
	for member, end := range set {
		if !end.After(now) {
			delete(set, member)
		}
	}
	if len(set) == 0 {
		delete(m.sets, id)
		return nil
	}
	return set
}

// Acquire implements Store.
func (m *Memory) Acquire(_ context.Context, s Slot, limit, capacity int64, ttl time.Duration) (Grant, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.live(s, now)
	held := int64(len(set))
	if _, ok := set[s.Member]; ok {
		set[s.Member] = now.Add(ttl)
		return Grant{Admitted: true, Held: held, ExpiresAt: now.Add(ttl), Now: now}, nil
	}
	if held >= limit {
		g := Grant{Held: held, Now: now, Reason: reasonOf(held, capacity)}
		first := now.Add(ttl)
		for _, end := range set {
			if end.Before(first) {
				first = end
			}
		}
		g.RetryAfter = first.Sub(now)
		return g, nil
	}
	if set == nil {
		set = map[string]time.Time{}
		m.sets[setID{s.Store, s.Key, s.Scope}] = set
	}
	set[s.Member] = now.Add(ttl)
	return Grant{Admitted: true, Held: held + 1, ExpiresAt: now.Add(ttl), Now: now}, nil
}

// Renew implements Store.
func (m *Memory) Renew(_ context.Context, s Slot, ttl time.Duration) (time.Time, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.live(s, now)
	end, ok := set[s.Member]
	if !ok {
		return time.Time{}, ErrLeaseNotFound
	}
	if next := now.Add(ttl); next.After(end) {
		end = next
	}
	set[s.Member] = end
	return end, nil
}

// Release implements Store.
func (m *Memory) Release(_ context.Context, s Slot) (bool, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.live(s, now)
	if _, ok := set[s.Member]; !ok {
		return false, nil
	}
	delete(set, s.Member)
	if len(set) == 0 {
		delete(m.sets, setID{s.Store, s.Key, s.Scope})
	}
	return true, nil
}

// Held is the leases of (store, key, scope) held now.
func (m *Memory) Held(store, key, scope string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live(Slot{Store: store, Key: key, Scope: scope}, m.now()))
}

// Sweep drops every expired lease (the sets of keys nobody asks about
// any more) and reports how many sets remain.
func (m *Memory) Sweep() int {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.sets {
		m.live(Slot{Store: id.store, Key: id.key, Scope: id.scope}, now)
	}
	return len(m.sets)
}

// Run sweeps every interval until ctx ends.
func (m *Memory) Run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.Sweep()
		}
	}
}
