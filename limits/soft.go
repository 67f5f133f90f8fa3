package limits

// softLimitEpsilon absorbs floating-point residue, so that consumption of
// exactly the soft limit's percentage reaches it.
const softLimitEpsilon = 1e-9

// SoftLimitReached reports whether spending used of capacity (tokens spent
// of a bucket's burst, or of a quota's limit) reaches percent. percent ≤ 0
// is no soft limit; a capacity ≤ 0 is never reached. This is the one rule
// for the limiter's warning, the lease's and the usage API's soft-limit
// state; enforcement/redisstore's decide.lua makes the same comparison in
// Lua (redisstore's agree_test.go holds the two together).
func SoftLimitReached(used, capacity, percent float64) bool {
	return percent > 0 && capacity > 0 && used/capacity*100+softLimitEpsilon >= percent
}

// SoftLimitReached reports whether a decision that left tokensLeft in the
// bucket, with quotaUsed spent of the current quota window, reaches l's
// soft limit (of the bucket, or of the quota).
func (l *Limit) SoftLimitReached(tokensLeft float64, quotaUsed int64) bool {
	if l.SoftLimitPercent <= 0 {
		return false
	}
	burst := float64(l.Burst)
	if SoftLimitReached(burst-tokensLeft, burst, l.SoftLimitPercent) {
		return true
	}
	return l.HasQuota() && SoftLimitReached(float64(quotaUsed), float64(l.QuotaLimit), l.SoftLimitPercent)
}
