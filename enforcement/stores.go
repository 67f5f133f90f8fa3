package enforcement

import (
	"context"
	"errors"
	"fmt"
)

// ErrUnknownStore is returned for a limit whose Store names no store the
// limiter has. A policy file naming one is refused, but the policy log
// applies the same records on every limiter whatever its stores, so a
// limiter may lack one the log names: the failure policy then decides the
// keys routed to it (degraded, as if that store were down), and the
// limiter's readiness names the store as missing.
var ErrUnknownStore = errors.New("enforcement: unknown store")

// Stores routes every call about a bucket to the store its limit names
// (Limit.Store: dedicated capacity; "" = the default store), so that a key
// is decided, leased and counted by exactly one store and a store that is
// down degrades only its own keys. It is an Authority and the lease half
// of a Store; the fleet heartbeat is per store (each Store's Beat). Safe
// for concurrent use; immutable.
type Stores struct {
	def   Store
	named map[string]Store
}

var _ Authority = (*Stores)(nil)

// NewStores routes to def and to the named stores (nil or empty: def only).
func NewStores(def Store, named map[string]Store) *Stores {
	return &Stores{def: def, named: named}
}

func (s *Stores) of(name string) (Store, error) {
	if name == "" {
		return s.def, nil
	}
	if st, ok := s.named[name]; ok {
		return st, nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownStore, name)
}

// Take implements Authority on the limit's store.
func (s *Stores) Take(ctx context.Context, key, scope string, lim Limit, cost int64) (Verdict, error) {
	st, err := s.of(lim.Store)
	if err != nil {
		return Verdict{}, err
	}
	return st.Take(ctx, key, scope, lim, cost)
}

// Lease is Store.Lease on the limit's store.
func (s *Stores) Lease(ctx context.Context, key, scope string, lim Limit, need, want int64) (Grant, error) {
	st, err := s.of(lim.Store)
	if err != nil {
		return Grant{}, err
	}
	return st.Lease(ctx, key, scope, lim, need, want)
}

// Return is Store.Return on the limit's store.
func (s *Stores) Return(ctx context.Context, key, scope string, lim Limit, n int64) (Grant, error) {
	st, err := s.of(lim.Store)
	if err != nil {
		return Grant{}, err
	}
	return st.Return(ctx, key, scope, lim, n)
}
