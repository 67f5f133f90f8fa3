package global

import "github.com/ratewarden/ratewarden/enforcement"

// PoolMax is poolMax at the largest horizon: the pool_max term of the
// bound.
func PoolMax(lim enforcement.Limit, maxCost int64) int64 { return poolMax(lim, maxHorizon, maxCost) }
