package global

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
)

// Reservations, settles and charges of a global limit spend the region's
// pool of the global budget, as its decisions do (docs/reserve-settle.md,
// docs/regions.md): a reservation is a decision that also records its
// estimate (reserve.lua), and a settle or a charge moves the pool by what
// the estimate missed (settle.lua), into debt if need be. The refiller
// leases a debt back from the global bucket like any shortfall, so the
// global bucket is charged every actual cost, and nothing crosses the WAN
// on the way.
var (
	//go:embed reserve.lua
	reserveLua string
	//go:embed settle.lua
	settleLua string

	reserveScript = redisstore.NewScript(poolLua + reserveLua)
	settleScript  = redisstore.NewScript(poolLua + settleLua)
)

var _ enforcement.Reserver = (*Global)(nil)

// recordKey is reservation id's record on a global key in the region's
// Redis: the pool's hash tag, apart from the regional records.
func (g *Global) recordKey(key, id string) string {
	return g.cfg.Prefix + ":{" + key + "}:gr:" + id
}

// Reserve implements enforcement.Reserver: a decision on the pool (as
// Take) that, when allowed, records reservation id for ttl.
func (g *Global) Reserve(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	return g.take(ctx, key, scope, lim, cost, id, ttl)
}

// Settle implements enforcement.Reserver: the pool moves by cost − the
// estimate of reservation id (the whole cost when unrecorded: a charge,
// or a reservation made while the region's Redis could not be asked), at
// most once. A refund goes back to where the estimate was spent; an
// excess is spent from the pool into debt, or with the home unreachable
// from what the pool holds and then the escrow.
func (g *Global) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	g.follow(key, scope, lim, 0) // the refiller pays a debt of a key this instance only settles
	if until := g.openUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		return enforcement.Settlement{}, errOpen
	}
	un, escrow := 0, 0
	if unrecorded {
		un = 1
	}
	if g.unreachable.Load() {
		escrow = 1
	}
	erate, eburst := escrowOf(lim, g.cfg.Regions)
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	res, err := settleScript.Run(ctx, g.cfg.Local, []string{g.poolKey(key, scope), g.recordKey(key, id)},
		cost, un, escrow, erate, eburst, max(1, ttl.Milliseconds()), g.cfg.TTL.Milliseconds()).Int64Slice()
	if err == nil && (len(res) != 7 || res[0] < -2 || res[0] == 0 || res[0] > 1) {
		err = fmt.Errorf("%d values (%v), want 7", len(res), res)
	}
	if err != nil {
		g.m.localErrors.Inc()
		return enforcement.Settlement{}, fmt.Errorf("global settle of %q in region %s: %w", scope, g.cfg.Region, err)
	}
	switch res[0] {
	case -1:
		return enforcement.Settlement{}, enforcement.ErrReservationNotFound
	case -2:
		return enforcement.Settlement{}, enforcement.ErrAlreadySettled
	}
	if res[2] < 0 {
		g.poke() // in debt: lease it back now
	}
	now := time.UnixMicro(res[5])
	return enforcement.Settlement{
		Estimate: res[1], Charged: cost, Refunded: max(0, res[1]-cost),
		Remaining: res[2], Debt: res[3],
		RetryAfter: time.Duration(res[4]) * time.Millisecond,
		// A pool is refilled in blocks, not at a rate: the local tier
		// learns nothing of when it is full (as from a decision).
		ResetAt:   now,
		QuotaUsed: res[6],
		Now:       now,
		// A settle reads no view of the global bucket: its warning
		// judges the quota alone, every region's use (the key's next
		// decision judges the bucket too; soft.go).
		Warning: lim.SoftLimitReached(float64(lim.Burst), res[6]),
	}, nil
}
