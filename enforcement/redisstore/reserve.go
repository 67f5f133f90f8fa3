package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
)

// Reservations are reserve.lua (a decision that also records the
// reservation) and settle.lua (the settle, and the charge), each on
// state.lua's bucket, so that they spend the bucket Take spends. Store runs
// each once per call (reservecall.lua, settlecall.lua); Pipelined runs them
// in batch.lua's batches beside the decisions.
var (
	//go:embed reserve.lua
	reserveLua string
	//go:embed settle.lua
	settleLua string
	//go:embed settlecall.lua
	settleCallLua string
	//go:embed reservecall.lua
	reserveCallLua string

	reserveScript = newSpendScript(stateLua + decideLua + reserveLua + reserveCallLua) // spend.go: sent at most once
	settleScript  = newSpendScript(stateLua + settleLua + settleCallLua)
)

var (
	_ enforcement.Reserver = (*Store)(nil)
	_ enforcement.Reserver = (*Pipelined)(nil)
	_ enforcement.Reserver = (*Shared)(nil)
)

// ReservationKey is the Redis key of reservation id's record on key's
// bucket: under the key's hash tag, so one script reads it and moves the
// bucket, on a Cluster too (keyslot.ReservationKey).
func (s *Store) ReservationKey(key, id string) string {
	return keyslot.ReservationKey(s.prefix, key, id)
}

// Reserve implements enforcement.Reserver in one round trip.
func (s *Store) Reserve(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	keys, args := s.bucketCall(key, scope, lim, cost)
	keys = append(keys, s.ReservationKey(key, id))
	args = append(args, ttlMS(ttl))
	res, err := reserveScript.run(ctx, s.rdb, keys, args...).Int64Slice()
	return verdictOf(keys[0], res, err)
}

// Settle implements enforcement.Reserver in one round trip.
func (s *Store) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	st, err := s.settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
	if err != nil {
		return enforcement.Settlement{}, err
	}
	return st.result()
}

// settleReply is settle.lua's answer: status is the script's (1, -1, -2).
type settleReply struct {
	status int64
	s      enforcement.Settlement
}

func (r settleReply) result() (enforcement.Settlement, error) {
	switch r.status {
	case -1:
		return enforcement.Settlement{}, enforcement.ErrReservationNotFound
	case -2:
		return enforcement.Settlement{}, enforcement.ErrAlreadySettled
	}
	return r.s, nil
}

func (s *Store) settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (settleReply, error) {
	bucketKey, quotaKey, quotaEnd := s.callKeys(key, scope, lim)
	un := 0
	if unrecorded {
		un = 1
	}
	keys := []string{bucketKey, quotaKey, s.ReservationKey(key, id)}
	res, err := settleScript.run(ctx, s.rdb, keys, lim.Rate, lim.Burst, cost, lim.QuotaLimit, quotaEnd, un, ttlMS(ttl)).Int64Slice()
	if err != nil {
		return settleReply{}, fmt.Errorf("redis settle script for %q: %w", bucketKey, err)
	}
	return settleReplyOf(bucketKey, cost, res)
}

// settleReplyOf reads settle.lua's answer (9 numbers) to a settle of cost.
func settleReplyOf(bucketKey string, cost int64, res []int64) (settleReply, error) {
	if len(res) != 9 || res[0] < -2 || res[0] > 1 || res[0] == 0 {
		return settleReply{}, fmt.Errorf("redis settle script for %q: %w: %v", bucketKey, errBadReply, res)
	}
	now := time.UnixMicro(res[6])
	return settleReply{status: res[0], s: enforcement.Settlement{
		Estimate: res[1], Charged: cost, Refunded: max(0, res[1]-cost),
		Remaining: res[2], Debt: res[3],
		RetryAfter: durMS(res[4]),
		ResetAt:    now.Add(durMS(res[5])),
		QuotaUsed:  res[7], Now: now,
	}}, nil
}

// durMS is ms as a Duration, saturated: a deep debt on a slow bucket can
// take longer to pay off than a Duration holds (292 years).
func durMS(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// ttlMS is a TTL in whole ms, at least 1 (PX refuses 0).
func ttlMS(ttl time.Duration) int64 { return max(1, ttl.Milliseconds()) }

// PreloadReserve loads the reservation scripts into every reachable server.
func (s *Store) PreloadReserve(ctx context.Context) error {
	if err := reserveScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("load reserve script: %w", err)
	}
	if err := settleScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("load settle script: %w", err)
	}
	return nil
}

// Reserve implements enforcement.Reserver under the key's guard (the
// deadline and breaker its decisions pass): in the pipeline's batches
// beside the decisions, or Store.Reserve when there is no pipeline.
func (s *Shared) Reserve(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	var v enforcement.Verdict
	var err error
	if s.pipe != nil {
		// The pipeline heeds its context: the call runs on this goroutine.
		err = s.guardFor(keyslot.KeySlot(key, scope)).DoHeeding(ctx, func(ctx context.Context) error {
			var err error
			v, err = s.pipe.Reserve(ctx, key, scope, lim, cost, id, ttl)
			return err
		})
	} else {
		err = s.do(ctx, key, scope, func(ctx context.Context) error {
			var err error
			v, err = s.store.Reserve(ctx, key, scope, lim, cost, id, ttl)
			return err
		})
	}
	if err != nil {
		return enforcement.Verdict{}, err
	}
	return v, nil
}

// Settle implements enforcement.Reserver under the key's guard, as
// Reserve. "Not found" and "already settled" are answers, not store
// failures.
func (s *Shared) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	var r settleReply
	var err error
	if s.pipe != nil {
		err = s.guardFor(keyslot.KeySlot(key, scope)).DoHeeding(ctx, func(ctx context.Context) error {
			var err error
			r, err = s.pipe.settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
			return err
		})
	} else {
		err = s.do(ctx, key, scope, func(ctx context.Context) error {
			var err error
			r, err = s.store.settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
			return err
		})
	}
	if err != nil {
		return enforcement.Settlement{}, err
	}
	return r.result()
}
