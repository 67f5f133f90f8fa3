package global

import (
	"context"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/limits"
)

// Run is the refiller: every Tick (and at once when a pool comes up
// short) it looks at each followed key's pool, and for the pools whose
// refill lock it holds, leases from the home up to the target and returns
// what idle pools hold. It probes the home when it had nothing to ask of
// it, so that reachability is always current. On ctx's end it returns what
// its pools hold (a last, bounded effort) and nil.
func (g *Global) Run(ctx context.Context) error {
	t := time.NewTimer(g.cfg.Tick)
	defer t.Stop()
	for {
		g.Tick(ctx)
		t.Reset(g.cfg.Tick)
		select {
		case <-ctx.Done():
			g.drain()
			return nil
		case <-t.C:
		case <-g.wake:
			// A short pool: refill sooner, but never in a loop (a key
			// held at its limit comes up short all the time).
			t.Reset(g.cfg.Tick / 5)
			select {
			case <-ctx.Done():
				g.drain()
				return nil
			case <-t.C:
			}
		}
	}
}

// Tick is one pass of the refiller (Run calls it; tests call it to step).
func (g *Global) Tick(ctx context.Context) {
	asked := false
	var held int64
	now := g.cfg.Now()
	g.keys.Range(func(k, v any) bool {
		if ctx.Err() != nil {
			return false
		}
		id, ks := k.(poolID), v.(*keyState)
		if g.forget(id, ks, now) {
			return true
		}
		if g.refill(ctx, id, ks, &asked) {
			held += max(0, ks.tokens)
		}
		return true
	})
	g.poolTokens.Store(held)
	if !asked && ctx.Err() == nil {
		g.probe(ctx)
	}
}

// forget drops a key this instance has not decided for a while and whose
// pool it does not hold tokens (or a debt) of: another instance, or
// nobody, refills it.
func (g *Global) forget(id poolID, ks *keyState, now time.Time) bool {
	idle := now.Sub(time.Unix(0, ks.lastUse.Load()))
	if idle < 2*idleHold*g.cfg.Hold || (ks.mine && ks.tokens != 0) {
		return false
	}
	g.keys.Delete(id)
	g.nkey.Add(-1)
	return true
}

// refill does one key's tick; it reports whether this instance holds the
// key's refill lock. asked is set when the home was called.
func (g *Global) refill(ctx context.Context, id poolID, ks *keyState, asked *bool) bool {
	lim := *ks.lim.Load()
	lctx, cancel := context.WithTimeout(ctx, g.cfg.LocalTimeout)
	res, err := tickScript.Run(lctx, g.cfg.Local, []string{g.poolKey(id.key, id.scope), g.lockKey(id.key, id.scope)},
		g.cfg.Member, (3*g.cfg.Tick).Milliseconds()+int64(g.cfg.LocalTimeout/time.Millisecond)).Int64Slice()
	cancel()
	if err != nil || len(res) != 6 {
		g.m.localErrors.Inc()
		ks.mine = false
		return false
	}
	mine, tokens, wanted, at, owed := res[0] == 1, res[1], res[2], time.UnixMicro(res[4]), res[5]
	// Demand is measured by whoever looks, so that a lock changing hands
	// finds the rate already known.
	if !ks.lookedAt.IsZero() && at.After(ks.lookedAt) {
		ks.rate = demandRate(ks.rate, wanted-ks.wanted, at.Sub(ks.lookedAt), g.cfg.Window)
	}
	if wanted != ks.wanted || ks.lastDemand.IsZero() {
		ks.lastDemand = at
	}
	ks.wanted, ks.lookedAt, ks.tokens, ks.mine = wanted, at, tokens, mine
	if !mine {
		return false
	}
	if owed > 0 && lim.HasQuota() && !g.unreachable.Load() {
		*asked = true
		g.chargeEscrow(ctx, id, lim, owed)
	}
	h := horizon(time.Duration(g.rttNS.Load()), g.cfg.Tick)
	floor := min(max(1, ks.maxCost.Load()), lim.Burst)
	p := planFor(tokens, target(ks.rate, lim, h, ks.maxCost.Load()), floor, at.Sub(ks.lastDemand), g.cfg.Hold)
	switch {
	case p.lease > 0 && !g.unreachable.Load():
		*asked = true
		g.lease(ctx, id, ks, lim, p.lease)
	case p.giveUp > 0 && !g.unreachable.Load():
		*asked = true
		g.giveBack(ctx, id, ks, lim, p.giveUp)
	}
	return true
}

// lease takes up to n tokens from the key's global bucket at the home and
// adds them to the pool.
func (g *Global) lease(ctx context.Context, id poolID, ks *keyState, lim enforcement.Limit, n int64) {
	hctx, cancel := context.WithTimeout(ctx, g.cfg.HomeTimeout)
	start := time.Now()
	ans, err := g.homeLease(hctx, id, lim, "lease", 1, n)
	cancel()
	g.homeResult(err, time.Since(start))
	if err != nil {
		return
	}
	gr := ans.granted
	if gr <= 0 {
		// Nothing for the pool, but a soft limit's view of the global
		// bucket is news: most of all when the bucket is empty.
		if lim.SoftLimitPercent > 0 {
			_, _ = g.fill(ctx, id, "add", 0, ans.used, ans.left)
		}
		return
	}
	g.m.leased.Add(float64(gr))
	if got, err := g.fill(ctx, id, "add", gr, ans.used, viewOf(lim, ans)); err == nil {
		ks.tokens = got
		return
	}
	// Leased and not in the pool: hand them straight back, else they are
	// lost until the global bucket refills them.
	g.returnHome(ctx, id, lim, gr)
}

// giveBack takes n tokens out of the pool (no decision can spend them
// then) and returns them to the home; a failed return puts them back.
func (g *Global) giveBack(ctx context.Context, id poolID, ks *keyState, lim enforcement.Limit, n int64) {
	moved, err := g.fillMoved(ctx, id, "take", n, -1, -1)
	if err != nil || moved <= 0 {
		return
	}
	ks.tokens -= moved
	ans, err := g.returnHome(ctx, id, lim, moved)
	if err != nil {
		if got, err := g.fill(ctx, id, "add", moved, -1, -1); err == nil {
			ks.tokens = got
		}
		return
	}
	g.m.returned.Add(float64(moved))
	// The home refunded the quota and holds the tokens again: the pool's
	// count of the quota and its view of the bucket follow, else its
	// decisions would take the returned tokens for spent.
	if lim.HasQuota() || lim.SoftLimitPercent > 0 {
		_, _ = g.fill(ctx, id, "add", 0, ans.used, viewOf(lim, ans))
	}
}

func (g *Global) returnHome(ctx context.Context, id poolID, lim enforcement.Limit, n int64) (homeAnswer, error) {
	hctx, cancel := context.WithTimeout(ctx, g.cfg.HomeTimeout)
	defer cancel()
	start := time.Now()
	ans, err := g.homeLease(hctx, id, lim, "return", n, 0)
	g.homeResult(err, time.Since(start))
	return ans, err
}

// chargeEscrow charges the home's quota counter with what the region
// spent on its escrow while cut off, once the home answers again, so that
// the quota counts those decisions too (they may take it past its limit:
// by at most what the escrow allowed). The pool's debt is cleared after
// the charge; a charge whose answer was lost is charged again (at most
// once per lost answer: the over-count is in the quota's favour).
func (g *Global) chargeEscrow(ctx context.Context, id poolID, lim enforcement.Limit, owed int64) {
	start, end := lim.QuotaPeriod.Window(g.cfg.Now())
	hctx, cancel := context.WithTimeout(ctx, g.cfg.HomeTimeout)
	t0 := time.Now()
	err := chargeScript.Run(hctx, g.cfg.Home, []string{g.home.QuotaKey(id.key, lim.QuotaID, start)},
		owed, limits.QuotaKeyExpiry(end).UnixMilli()).Err()
	cancel()
	g.homeResult(err, time.Since(t0))
	if err == nil {
		_, _ = g.fillMoved(ctx, id, "paid", owed, -1, -1)
	}
}

// homeAnswer is what a lease or a return at the home answered: the
// tokens granted, the quota's count after (-1: no quota), and the whole
// tokens the global bucket holds after (-1: not known).
type homeAnswer struct{ granted, used, left int64 }

// viewOf is what a fill records of the global bucket from ans: nothing
// (-1) for a limit without a soft limit, which never reads it.
func viewOf(lim enforcement.Limit, ans homeAnswer) int64 {
	if lim.SoftLimitPercent <= 0 {
		return -1
	}
	return ans.left
}

// homeLease is a lease or a return on the key's global bucket at the
// home: redisstore's lease script, or, for a limit with a calendar quota,
// homelease.lua, which charges (and refunds) the quota there too.
func (g *Global) homeLease(ctx context.Context, id poolID, lim enforcement.Limit, mode string, a, want int64) (homeAnswer, error) {
	if !lim.HasQuota() {
		var gr enforcement.Grant
		var err error
		if mode == "lease" {
			gr, err = g.home.Lease(ctx, id.key, id.scope, lim, a, want)
		} else {
			gr, err = g.home.Return(ctx, id.key, id.scope, lim, a)
		}
		if err != nil {
			return homeAnswer{used: -1, left: -1}, err
		}
		return homeAnswer{granted: gr.Granted, used: -1, left: gr.Left}, nil
	}
	start, end := lim.QuotaPeriod.Window(g.cfg.Now())
	keys := []string{g.home.BucketKey(id.key, id.scope), g.home.QuotaKey(id.key, lim.QuotaID, start)}
	res, err := homeLeaseScript.Run(ctx, g.cfg.Home, keys, lim.Rate, lim.Burst, mode, a, want,
		lim.QuotaLimit, limits.QuotaKeyExpiry(end).UnixMilli()).Int64Slice()
	if err == nil && len(res) != 7 {
		err = fmt.Errorf("home lease script: %d values, want 7", len(res))
	}
	if err != nil {
		return homeAnswer{used: -1, left: -1}, fmt.Errorf("home lease (%s) of %q: %w", mode, id.scope, err)
	}
	ans := homeAnswer{granted: res[0], used: res[6], left: res[1]}
	if mode == "lease" && ans.granted <= 0 && lim.QuotaLimit-ans.used < a {
		ans.left = -1 // refused by the quota before the bucket was read
	}
	return ans, nil
}

// fill runs fill.lua and returns the pool's tokens after it. used and
// left are the home's quota count and bucket tokens to record (-1: none).
func (g *Global) fill(ctx context.Context, id poolID, mode string, n, used, left int64) (int64, error) {
	res, err := g.fillRun(ctx, id, mode, n, used, left)
	if err != nil {
		return 0, err
	}
	return res[1], nil
}

func (g *Global) fillMoved(ctx context.Context, id poolID, mode string, n, used, left int64) (int64, error) {
	res, err := g.fillRun(ctx, id, mode, n, used, left)
	if err != nil {
		return 0, err
	}
	return res[0], nil
}

func (g *Global) fillRun(ctx context.Context, id poolID, mode string, n, used, left int64) ([]int64, error) {
	lctx, cancel := context.WithTimeout(ctx, g.cfg.LocalTimeout)
	defer cancel()
	res, err := fillScript.Run(lctx, g.cfg.Local, []string{g.poolKey(id.key, id.scope), g.viewKey(id.key, id.scope)},
		mode, n, g.cfg.TTL.Milliseconds(), used, left).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("fill script: %d values, want 2", len(res))
	}
	if err != nil {
		g.m.localErrors.Inc()
		return nil, err
	}
	return res, nil
}

// probe asks the home for nothing but an answer.
func (g *Global) probe(ctx context.Context) {
	hctx, cancel := context.WithTimeout(ctx, g.cfg.HomeTimeout)
	defer cancel()
	start := time.Now()
	err := g.cfg.Home.Ping(hctx).Err()
	g.homeResult(err, time.Since(start))
}

// drain returns, when the refiller stops, what the pools it refills hold:
// each with its own short deadline, on a context of its own (Run's has
// ended).
func (g *Global) drain() {
	if g.unreachable.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*g.cfg.HomeTimeout)
	defer cancel()
	g.keys.Range(func(k, v any) bool {
		id, ks := k.(poolID), v.(*keyState)
		if ks.mine && ks.tokens > 0 && ctx.Err() == nil {
			g.giveBack(ctx, id, ks, *ks.lim.Load(), ks.tokens)
		}
		return ctx.Err() == nil
	})
}
