// Package redisstore is the shared authority in Redis or Redis Cluster: one
// Lua script that reads, decides and writes a token bucket (and its calendar
// quota) atomically, called with EVALSHA.
package redisstore

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/limits"
)

// The decision itself is decide.lua, one Lua function; bucket.lua runs it
// once per call (Store), batch.lua many times (Pipelined). state.lua, the
// bucket's stored form, comes first in every script that touches a bucket.
var (
	//go:embed state.lua
	stateLua string
	//go:embed decide.lua
	decideLua string
	//go:embed bucket.lua
	bucketLua string
	//go:embed batch.lua
	batchLua string

	bucketScript = newSpendScript(stateLua + decideLua + bucketLua) // spend.go: sent at most once
	batchScript  = newSpendScript(stateLua + decideLua + reserveLua + settleLua + slotsetLua + batchLua)
)

// Store is an enforcement.Authority backed by Redis. It is safe for
// concurrent use.
type Store struct {
	rdb    redis.Scripter
	prefix string
}

var _ enforcement.Authority = (*Store)(nil)

// New returns a store whose keys start with prefix (limits.DefaultKeyPrefix
// when empty; tests use their own prefix to stay isolated on a shared
// server). rdb is any go-redis client that runs scripts: a *redis.Client,
// *redis.ClusterClient or *redis.Ring.
func New(rdb redis.Scripter, prefix string) *Store {
	if prefix == "" {
		prefix = limits.DefaultKeyPrefix
	}
	return &Store{rdb: rdb, prefix: prefix}
}

// BucketKey is the Redis key of the bucket for (key, scope). The rate-limit
// key is the hash tag, so a bucket and its quota counters share one Cluster
// slot and one script can touch both. "b2": the second stored form
// (state.lua); the first, a hash under ":b:", is never read.
func (s *Store) BucketKey(key, scope string) string {
	return keyslot.BucketKey(s.prefix, key, scope)
}

// DecodeBucket reads a bucket's stored value (GET of BucketKey, state.lua):
// its tokens at its last update and that update's time on the store's
// clock (µs since the epoch). A bucket Redis does not hold is full.
func DecodeBucket(v string) (enforcement.Bucket, error) {
	if len(v) != 16 {
		return enforcement.Bucket{}, fmt.Errorf("%w: a bucket of %d bytes, want 16", errBadReply, len(v))
	}
	return enforcement.Bucket{Tokens: math.Float64frombits(le64(v)), TS: int64(math.Float64frombits(le64(v[8:])))}, nil
}

// ReadBucket is the bucket Redis holds under bucketKey (BucketKey); found
// is false when it holds none (a full bucket).
func ReadBucket(ctx context.Context, rdb redis.StringCmdable, bucketKey string) (b enforcement.Bucket, found bool, err error) {
	v, err := rdb.Get(ctx, bucketKey).Result()
	if errors.Is(err, redis.Nil) {
		return enforcement.Bucket{}, false, nil
	}
	if err == nil {
		b, err = DecodeBucket(v)
	}
	if err != nil {
		return enforcement.Bucket{}, false, fmt.Errorf("read bucket %q: %w", bucketKey, err)
	}
	return b, true, nil
}

// EncodeBucket is the stored value of b, as the scripts write it (tools and
// tests that set a bucket's state by hand).
func EncodeBucket(b enforcement.Bucket) string {
	out := binary.LittleEndian.AppendUint64(nil, math.Float64bits(b.Tokens))
	return string(binary.LittleEndian.AppendUint64(out, math.Float64bits(float64(b.TS))))
}

// QuotaKey is the Redis key of the quota counter of key for the window that
// starts at windowStart.
// The layout is limits.QuotaKey, shared with the reconciler and the usage API.
func (s *Store) QuotaKey(key, quotaID string, windowStart time.Time) string {
	return limits.QuotaKey(s.prefix, key, quotaID, windowStart)
}

// Take implements enforcement.Authority with one round trip (EVALSHA; EVAL
// on NOSCRIPT). A call that may have reached Redis is never sent again
// (spend.go).
func (s *Store) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	keys, args := s.bucketCall(key, scope, lim, cost)
	res, err := bucketScript.run(ctx, s.rdb, keys, args...).Int64Slice()
	return verdictOf(keys[0], res, err)
}

// bucketCall is the KEYS and ARGV of one bucket decision (bucket.lua,
// peek.lua; reservecall.lua adds the TTL).
func (s *Store) bucketCall(key, scope string, lim enforcement.Limit, cost int64) (keys []string, args []any) {
	bucketKey, quotaKey, quotaEnd := s.callKeys(key, scope, lim)
	a := decideArgs(lim, cost, quotaEnd)
	return []string{bucketKey, quotaKey}, []any{a.rate, a.burst, a.cost, a.qlimit, a.qend, a.soft, a.floor}
}

// spendArgs are the numbers decide.lua's decide takes after its keys, in
// its order (bucket.lua's ARGV, batch.lua's packed doubles after the op):
// decideArgs is the one place they are read from a limit.
type spendArgs struct {
	rate   float64
	burst  int64
	cost   int64
	qlimit int64
	qend   int64   // the quota window's end, ms
	soft   float64 // the soft limit, %
	floor  float64 // tokens the request must leave (limits.Limit.Floor)
}

func decideArgs(lim enforcement.Limit, cost, quotaEnd int64) spendArgs {
	return spendArgs{lim.Rate, lim.Burst, cost, lim.QuotaLimit, quotaEnd, lim.SoftLimitPercent, lim.Floor()}
}

// callKeys is the bucket key, the quota key and the quota window's end (ms)
// of one decision.
func (s *Store) callKeys(key, scope string, lim enforcement.Limit) (bucketKey, quotaKey string, quotaEnd int64) {
	bucketKey = s.BucketKey(key, scope)
	quotaKey, quotaEnd = s.quotaOf(bucketKey, key, lim)
	return bucketKey, quotaKey, quotaEnd
}

// quotaOf is the quota key and the quota window's end (ms) of a decision
// on the bucket bucketKey of key.
func (s *Store) quotaOf(bucketKey, key string, lim enforcement.Limit) (quotaKey string, quotaEnd int64) {
	quotaKey = bucketKey // unused by the script without a quota; same slot either way
	if lim.HasQuota() {
		// The quota window is chosen on the caller's clock: a few ms of skew
		// between replicas only moves which side of midnight a request near
		// the boundary counts on.
		start, end := lim.QuotaPeriod.Window(time.Now())
		quotaKey = s.QuotaKey(key, lim.QuotaID, start)
		quotaEnd = end.UnixMilli()
	}
	return quotaKey, quotaEnd
}

// verdictOf reads the script's reply, checking its shape.
func verdictOf(bucketKey string, res []int64, err error) (enforcement.Verdict, error) {
	if err != nil {
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %w", bucketKey, err)
	}
	if len(res) != 8 {
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %w: %d values", bucketKey, errBadReply, len(res))
	}
	if res[0] < 0 || res[0] > 2 {
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %w: verdict %d", bucketKey, errBadReply, res[0])
	}
	return enforcement.Verdict{
		Allowed:    res[0] == 1,
		Shed:       res[0] == 2,
		Remaining:  res[1],
		RetryAfter: time.Duration(res[2]) * time.Millisecond,
		ResetAfter: time.Duration(res[3]) * time.Millisecond,
		Now:        time.UnixMicro(res[4]),
		Warning:    res[5] == 1,
		QuotaUsed:  res[6],
		ClockBack:  res[7] == 1,
	}, nil
}

var errBadReply = errors.New("unexpected reply shape")

// le64 is the little-endian uint64 at the start of s.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// Preload loads the scripts into every reachable server so that the first
// decisions do not pay for a NOSCRIPT round trip.
func (s *Store) Preload(ctx context.Context) error {
	if err := bucketScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("load bucket script: %w", err)
	}
	if err := batchScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("load batch bucket script: %w", err)
	}
	return nil
}
