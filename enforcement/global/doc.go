// Package global enforces global limits (policy `scope: global`) in a
// deployment of several regions: one limit shared by every region, every
// decision made in its own region from its own Redis, with no WAN on the
// decision path (docs/regions.md).
//
// # Scheme
//
// A hierarchy on the existing token leasing: the GLOBAL BUCKET of a key
// lives in the home region's Redis (the buckets of redisstore, under the
// home prefix + ":g"); each region keeps a POOL of that key's tokens in its
// own Redis. A decision is one script call on the region's Redis
// (decide.lua: one GET, one SET, as the regional bucket script), spending
// from the pool. The refiller (Global.Run, one per limiter, with a SET NX
// PX lock so that one instance per region refills a key) measures the
// region's demand from the pool's counter of asked tokens, and keeps the
// pool at demand × horizon (horizon = the round trip to the home + two
// ticks), capped at pool_max, leasing from the global bucket with
// redisstore's lease script (never more than the bucket holds). A pool
// nobody asks of for Hold goes back (redisstore's return script); one
// holding more than twice its target gives back the excess, so the budget
// follows demand between regions within a few ticks and the demand window.
//
// A calendar quota on a global key is charged at the home with each lease
// (homelease.lua: the lease and the quota counter in one script), refunded
// on return: every region's tokens are prepaid, so the quota counts every
// region.
//
// A soft limit on a global key is judged against every region's use,
// without a call to the home: the bucket by the region's view of the
// global bucket (what it held at the refiller's last lease there, refilled
// since, plus the pool), the quota by the home's count (soft.go).
//
// Reservations, settles and charges (Global implements
// enforcement.Reserver) spend the pool as decisions do (reserve.lua,
// settle.lua): a reservation spends its estimate and records it in the
// region's Redis; a settle moves the pool by actual − estimate, a charge
// by its cost, below zero if need be. A pool in debt rejects everything,
// cost 0 too, and the refiller leases the debt from the global bucket at
// its next tick, so the global bucket is charged every actual cost.
//
// While the latest call to the home failed, a region decides on what its
// pool holds, then on its ESCROW: a bucket of rate ÷ N and burst ÷ N in the
// pool key (N = LIMITER_REGIONS's length), decisions marked regional
// (enforcement.SourceRegional); what they spend of a quota is owed in the
// pool and charged at the home once it answers (charge.lua). It rejoins by
// itself at the first answer (the refiller probes the home every tick).
//
// # The over-admission bound
//
// Every token a pool spends was taken from the global bucket, which counts
// it; pools only move when tokens are spent. So over any interval of length
// d, the regions together admit
//
//	admitted(d) ≤ burst + rate × d + Σ_r pool_max_r + Σ_cut (burst/N + rate/N × cut_r)
//
// where pool_max = min(burst, max(⌈rate × horizon⌉, largest cost)) with
// horizon ≤ 2 s (in practice RTT + 2 × 50 ms), the last sum over the
// regions cut off from the home during the interval, each for cut_r of it.
// A region that dies takes its pool with it: those tokens were counted by
// the global bucket and come back by its refill within pool_max ÷ rate.
// With the home itself unreachable, every region is on its escrow: the
// regions together admit at most (N−1)/N of the limit's rate meanwhile
// (the home region's own limiters share its fate).
//
// Below rate × RTT ≈ 100 tokens the pools are small (pool_max ≈ rate ×
// horizon) and a region's refill trails its demand by about a round trip:
// the limit is held more tightly, and a region whose demand starts cold
// rejects for about one round trip to the home, so utilisation falls.
package global
