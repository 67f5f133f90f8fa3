package limits

import (
	"strconv"
	"time"
)

// DefaultKeyPrefix is the prefix of every Redis key of the limiter when
// REDIS_KEY_PREFIX is not set.
const DefaultKeyPrefix = "rl"

// QuotaKeyGrace is how long a quota counter outlives its window: the bucket
// script (enforcement/redisstore/decide.lua) sets PEXPIREAT window end + 60 s
// on every spend, and the reconciler sets the same, so that a counter read
// at the very end of a window by a replica whose clock is a little behind is
// still there.
const QuotaKeyGrace = time.Minute

// QuotaKey is the Redis key of the counter of quota quotaID of key for the
// window that starts at windowStart:
//
//	<prefix>:{<key>}:q:<quotaID>:<window start, unix seconds>
//
// The rate-limit key is the Cluster hash tag, so a key's buckets and quota
// counters share one slot. This is the one place the layout is written: the
// limiter (redisstore), the reconciler and the usage API all call it.
func QuotaKey(prefix, key, quotaID string, windowStart time.Time) string {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return prefix + ":{" + key + "}:q:" + quotaID + ":" + strconv.FormatInt(windowStart.Unix(), 10)
}

// QuotaKeyExpiry is the absolute expiry of the counter of the window that
// ends at windowEnd (see QuotaKeyGrace).
func QuotaKeyExpiry(windowEnd time.Time) time.Time { return windowEnd.Add(QuotaKeyGrace) }
