package global

import (
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// softLimitReached is the soft-limit warning of a decision v on a global
// limit (Verdict.Warning).
//
// The rule: a global limit's soft limit is reached when every region's use
// together reaches SoftLimitPercent of the burst or of the calendar quota.
// Why: it is one limit shared by every region, so one region's share of it
// says nothing (a pool is sized to its region's demand over a round trip,
// not to the budget), and a region must not stay silent because each
// region is below the threshold while together they are above it. A
// decision may not ask the home (no WAN on the decision path), so it
// judges by the best knowledge of the global budget in the region's own
// Redis:
//
//   - the bucket: the whole tokens the home's global bucket held when the
//     refiller last leased (or returned, or was refused) there, the
//     region's view, refilled at the limit's rate since and capped at
//     burst, plus what the region's pool holds after this decision: the
//     budget left at that lease, less the region's own spending since.
//     Tokens other regions hold in their pools count as spent, as the
//     global bucket counts them (a pool holds at most its region's demand
//     over the horizon); what other regions take after the view is known
//     at the next lease, within a tick or two while the region has demand.
//   - the quota: the home's count at the last lease less what the pool
//     still holds (Verdict.QuotaUsed), every region's spending.
//
// Without a view (the region's refiller has not heard from the home about
// the key yet, or not for the view's TTL) only the quota is judged. A decision
// on the escrow (the home unreachable: Verdict.Regional) is judged against
// the escrow, the region's share of burst ÷ N, as the limiter's degraded
// path judges its share of a limit: the global budget is not known then.
func softLimitReached(lim enforcement.Limit, regions int, v enforcement.Verdict, pool, homeLeft int64, homeAge time.Duration) bool {
	if v.Regional {
		share := lim
		_, share.Burst = escrowOf(lim, regions)
		return share.SoftLimitReached(float64(v.Remaining), v.QuotaUsed)
	}
	burst := float64(lim.Burst)
	left := burst
	if homeLeft >= 0 {
		bucket := min(burst, float64(homeLeft)+lim.Rate*homeAge.Seconds())
		left = min(burst, bucket+float64(pool))
	}
	return lim.SoftLimitReached(left, v.QuotaUsed)
}
