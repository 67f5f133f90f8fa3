package redisstore

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/ratewarden/ratewarden/enforcement"
)

// A peek is decide.lua run dry: the same arithmetic as a decision, so that
// it answers exactly what the decision would, with the writes skipped.
var (
	//go:embed peek.lua
	peekLua string

	peekScript = newSpendScript(stateLua + decideLua + peekLua)
)

var (
	_ enforcement.Peeker = (*Store)(nil)
	_ enforcement.Peeker = (*Shared)(nil)
)

// Peek implements enforcement.Peeker: what Take would answer for cost on
// (key, scope) now, with nothing written (the bucket and the quota counter
// are left byte for byte as they were). One round trip.
func (s *Store) Peek(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	keys, args := s.bucketCall(key, scope, lim, cost)
	res, err := peekScript.run(ctx, s.rdb, keys, args...).Int64Slice()
	v, err := verdictOf(keys[0], res, err)
	if err != nil {
		return v, fmt.Errorf("peek: %w", err)
	}
	return v, nil
}

// Peek implements enforcement.Peeker (Store.Peek under the key's guard:
// the deadline and breaker its decisions pass).
func (s *Shared) Peek(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	var v enforcement.Verdict
	err := s.do(ctx, key, scope, func(ctx context.Context) error {
		var err error
		v, err = s.store.Peek(ctx, key, scope, lim, cost)
		return err
	})
	if err != nil {
		return enforcement.Verdict{}, err
	}
	return v, nil
}
