package redisstore

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
)

// settleAtScript runs settle.lua's function at a given now (µs, ARGV[8]);
// the record key is KEYS[3], the TTL is left to Redis (atEntryTail reads
// the bucket's).
var settleAtScript = redis.NewScript(stateLua + settleLua + `
local t0 = redis.call('TIME')
local r = settle(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                 tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]))` + atEntryTail)

// TestSettleAgreesWithGo: settle.lua and enforcement.Bucket.Charge (with
// the numbers settlementOf reports), interleaved with decisions on the
// same bucket, agree at every step: remaining, debt, retry and reset
// times, and the stored balance to the last bit, into debt and out of it.
func TestSettleAgreesWithGo(t *testing.T) {
	c := agreeClient(t)
	ctx := context.Background()
	s := New(c, "agreesettle")
	const sequences, steps = 200, 40
	for seq := range sequences {
		rng := rand.New(rand.NewPCG(uint64(seq), 3636))
		lim := randomLimit(rng, false)
		lim.SoftLimitPercent = 0
		now := time.Now().UnixMicro()
		var b enforcement.Bucket
		key := fmt.Sprintf("k%d", seq)
		bkey := s.BucketKey(key, "s")
		var retry time.Duration
		left := lim.Burst
		for step := range steps {
			now += randomStep(rng, lim, retry, true)
			where := fmt.Sprintf("sequence %d step %d (rate %v burst %d, now %d)", seq, step, lim.Rate, lim.Burst, now)
			if rng.IntN(3) == 0 { // a decision on the same bucket: in debt it rejects
				cost := randomCost(rng, lim, max(0, left))
				want := b.Take(now, lim.Rate, lim.Burst, cost)
				res := runAt(t, ctx, c, decideAtScript, []string{bkey, bkey}, 3, lim.Rate, lim.Burst, cost, 0, 0, 0, 0, now)
				got, err := verdictOf(bkey, res, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed != want.Allowed || got.Remaining != int64(math.Floor(want.Tokens+1e-9)) || got.RetryAfter != msOf(want.RetryAfterUS) {
					t.Fatalf("%s, take %d: Lua %+v, Go %+v", where, cost, got, want)
				}
				left, retry = got.Remaining, got.RetryAfter
				forgetFull(&b, lim)
				continue
			}
			// A settle: of a recorded estimate (a refund or more), or a
			// charge (no record).
			rkey := s.ReservationKey(key, fmt.Sprint(step))
			estimate, unrecorded := int64(0), "1"
			if rng.IntN(2) == 0 {
				estimate, unrecorded = rng.Int64N(lim.Burst+1), "0"
				if err := c.Set(ctx, rkey, "r"+string(le64bytes(math.Float64bits(float64(estimate)))), time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			cost := rng.Int64N(2*lim.Burst + 1)
			tokens, resetUS := b.Charge(now, lim.Rate, lim.Burst, cost-estimate)
			res := runAt(t, ctx, c, settleAtScript, []string{bkey, bkey, rkey}, 5, lim.Rate, lim.Burst, cost, 0, 0, unrecorded, 60000, now)
			if len(res) != 9 || res[0] != 1 {
				t.Fatalf("%s: settle script: %v", where, res)
			}
			wantRetry := int64(0)
			if tokens+1e-9 < 1 {
				wantRetry = (ceilUSOf((1-tokens)/lim.Rate) + 999) / 1000
			}
			debt := int64(0)
			if tokens < -1e-9 {
				debt = int64(math.Ceil(-tokens - 1e-9))
			}
			if res[1] != estimate || res[2] != int64(math.Floor(tokens+1e-9)) || res[3] != debt || res[4] != wantRetry ||
				res[5] != (resetUS+999)/1000 {
				t.Fatalf("%s, settle %d of %d: Lua %v, Go tokens %v debt %d retry %d reset %d µs", where, cost, estimate, res, tokens, debt, wantRetry, resetUS)
			}
			if stored, found, err := ReadBucket(ctx, c, bkey); err != nil {
				t.Fatal(err)
			} else if found && (stored.Tokens != b.Tokens || stored.TS != b.TS) {
				t.Fatalf("%s: Lua stored %+v, Go %+v", where, stored, b)
			}
			left, retry = res[2], durMS(res[4])
			forgetFull(&b, lim)
		}
	}
}

// le64bytes is v little-endian, as struct.pack('<d') writes a double.
func le64bytes(v uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return b
}

// ceilUSOf is enforcement's ceilUS: seconds to whole µs, rounded up.
func ceilUSOf(seconds float64) int64 {
	if seconds <= 0 {
		return 0
	}
	x := seconds*1e6 - 1e-9
	if x >= 1<<53 {
		return 1 << 53
	}
	i := int64(x)
	if float64(i) < x {
		i++
	}
	return i
}
