package redisstore

// The Go bucket (enforcement.Bucket, through enforcement.MemoryAuthority)
// and the Lua one (state.lua, decide.lua, lease.lua on a real redis-server)
// must give the same answers: these tests drive both through the same
// seeded random sequences and compare every verdict, remaining and retry
// time. The scripts read Redis TIME; the exact tests call the same Lua
// functions through a test entry that takes `now` as an argument instead,
// and TestStoreAgreesWithGoOnRedisTime runs the production scripts on Redis
// TIME, taking the time each call used from what it stored.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// decideAt and leaseAt run decide.lua's and lease.lua's functions at a
// given now (µs, the last argument) instead of Redis TIME. The test's clock
// is not Redis's, so a bucket's TTL (the time to refill on the test's clock)
// would end on Redis's at the wrong moment: after the call the entry reads
// the TTL the function set, answers it (and how long the call took on
// Redis's clock, µs) as two more values (-2 when the key is gone), and then
// removes it. The function itself deletes a bucket it finds full, as it does
// in production.
const atEntryTail = `
r[#r + 1] = redis.call('PTTL', KEYS[1])
local t1 = redis.call('TIME')
r[#r + 1] = (tonumber(t1[1]) - tonumber(t0[1])) * 1000000 + tonumber(t1[2]) - tonumber(t0[2])
redis.call('PERSIST', KEYS[1])
return r`

var (
	decideAtScript = redis.NewScript(stateLua + decideLua + `
local t0 = redis.call('TIME')
local r = { decide(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                   tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
                   tonumber(ARGV[8])) }` + atEntryTail)
	leaseAtScript = redis.NewScript(stateLua + leaseLua + `
local t0 = redis.call('TIME')
local r = { lease(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]),
                  tonumber(ARGV[5]), tonumber(ARGV[6])) }` + atEntryTail)
)

// runAt runs one of the scripts above and checks the TTL it reports: the
// reset time (at index resetAt) less at most the time the call took, when
// the bucket is held; -2 when it is gone (full). It returns the function's
// own values.
func runAt(t testing.TB, ctx context.Context, c *redis.Client, script *redis.Script, keys []string, resetAt int, args ...any) []int64 {
	t.Helper()
	res, err := script.Run(ctx, c, keys, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	n := len(res) - 2
	res, pttl, tookUS := res[:n], res[n], res[n+1]
	reset := res[resetAt]
	if reset == 0 && pttl == -2 {
		return res
	}
	if pttl > reset || pttl < reset-(tookUS+999)/1000-1 {
		t.Fatalf("bucket TTL %d ms after the call, want its reset time %d ms less at most the call's %d µs", pttl, reset, tookUS)
	}
	return res
}

func agreeClient(t testing.TB) *redis.Client {
	t.Helper()
	r := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// randomLimit is a limit over the whole range the policy allows: rates from
// a token a day to a million a second, bursts from 1 to 10⁹, soft limits
// and quotas on some.
func randomLimit(rng *rand.Rand, quota bool) enforcement.Limit {
	lim := enforcement.Limit{
		Rate:  math.Pow(10, rng.Float64()*11-5), // 1e-5 .. 1e6 per second
		Burst: int64(math.Pow(10, rng.Float64()*9)),
	}
	switch rng.IntN(4) {
	case 0: // whole rates, the common case, where float residue meets round numbers
		lim.Rate = []float64{float64(1 + rng.IntN(1000)), 10, 100, 1000, 3, 7}[rng.IntN(6)]
	case 1:
		lim.Burst = 1 + rng.Int64N(20)
	}
	// A bucket refills within 30 years: a time.Duration holds 292.
	lim.Rate = max(lim.Rate, float64(lim.Burst)/1e9)
	if rng.IntN(2) == 0 {
		lim.SoftLimitPercent = []float64{50, 80, 100, 1 + rng.Float64()*99}[rng.IntN(4)]
	}
	if quota {
		lim.QuotaLimit = 1 + rng.Int64N(4*lim.Burst)
		lim.QuotaPeriod = []enforcement.Period{enforcement.PeriodHour, enforcement.PeriodDay, enforcement.PeriodMonth}[rng.IntN(3)]
		lim.QuotaID = "q"
	}
	return lim
}

// randomCost is a request's cost: often 1, sometimes the whole burst,
// what is left or just past it, sometimes more than could ever fit.
func randomCost(rng *rand.Rand, lim enforcement.Limit, remaining int64) int64 {
	switch rng.IntN(8) {
	case 0:
		return 0
	case 1:
		return lim.Burst
	case 2:
		return max(0, remaining)
	case 3:
		return remaining + 1
	case 4:
		return lim.Burst + 1 + rng.Int64N(10)
	case 5, 6:
		return 1
	}
	return rng.Int64N(lim.Burst + 1)
}

// randomStep is how far the clock moves before a decision (µs): not at all,
// a fraction of a token's refill, about what the last retry said, a long
// idle spell, or (when back is allowed) a step backwards.
func randomStep(rng *rand.Rand, lim enforcement.Limit, lastRetry time.Duration, back bool) int64 {
	perToken := 1e6 / lim.Rate
	switch rng.IntN(11) {
	case 0:
		return 0
	case 1:
		return 1 + rng.Int64N(1000)
	case 8: // whole ms, as a caller that waits what it was told does
		return 1000 * (1 + rng.Int64N(500))
	case 2, 3:
		return int64(rng.Float64() * perToken * 3)
	case 4: // what the last retry said (at most ten days), give or take a µs
		step := min(lastRetry, 10*24*time.Hour).Microseconds() + rng.Int64N(3) - 1
		if !back {
			step = max(0, step)
		}
		return step
	case 5: // up to a whole refill, at most ten days
		return int64(rng.Float64() * min(float64(lim.Burst)*perToken, 10*24*3600e6))
	case 6:
		return int64(rng.Float64() * 3 * 3600e6)
	case 7:
		if back {
			return -1 - rng.Int64N(2e6)
		}
	}
	return rng.Int64N(100_000)
}

// TestDecideAgreesWithGo: decide.lua and MemoryAuthority, at the same now,
// through the same sequences, give the same verdicts.
func TestDecideAgreesWithGo(t *testing.T) {
	c := agreeClient(t)
	s := New(c, "agree")
	for seq := range 400 {
		decideSequence(t, c, s, uint64(seq), seq%3 == 0, 40)
	}
}

// FuzzDecideAgreesWithGo is TestDecideAgreesWithGo with the fuzzer choosing
// the sequence (go test -fuzz FuzzDecideAgreesWithGo ./enforcement/redisstore).
func FuzzDecideAgreesWithGo(f *testing.F) {
	c := agreeClient(f)
	s := New(c, "agreefuzz")
	f.Add(uint64(1), false, uint8(40))
	f.Add(uint64(48), true, uint8(40))
	f.Fuzz(func(t *testing.T, seed uint64, quota bool, steps uint8) {
		decideSequence(t, c, s, seed, quota, int(steps))
	})
}

// decideSequence drives decide.lua and MemoryAuthority through one random
// sequence of steps decisions on one key, chosen by seed.
func decideSequence(t *testing.T, c *redis.Client, s *Store, seed uint64, quota bool, steps int) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 26))
	lim := randomLimit(rng, quota)
	// Half the sequences decide for a priority class below share 1 (its
	// own generator, so the other draws stay as they were).
	if cls := rand.New(rand.NewPCG(seed, 49)); cls.IntN(2) == 0 {
		lim.Share = []float64{0.5, 0.8, 0.25, 0.01 + 0.98*cls.Float64()}[cls.IntN(4)]
	}
	// Start on today's clock: the quota counter's PEXPIREAT is on Redis's
	// clock, and a window ended long ago would expire at once. The steps
	// only go forward where there is a quota: the Go authority starts a
	// window afresh when the clock steps back into the previous one, and
	// Redis finds the counter it kept.
	now := time.Now().UnixMicro()
	var clock time.Time
	var latest int64
	mem := enforcement.NewMemoryAuthority(func() time.Time { return clock }, 1<<10)
	key := fmt.Sprintf("k%d-%v-%d", seed, quota, now) // fresh keys: a fuzzer repeats seeds
	var last enforcement.Verdict
	last.Remaining = lim.Burst
	for step := range steps {
		now += randomStep(rng, lim, last.RetryAfter, !quota)
		clock = time.UnixMicro(now)
		cost := randomCost(rng, lim, last.Remaining)

		want, err := mem.Take(ctx, key, "s", lim, cost)
		if err != nil {
			t.Fatal(err)
		}
		// Redis forgets a bucket as soon as it is full (its TTL ends, or
		// the script deletes it), the Go authority at its next Sweep:
		// sweep now, at the bucket's last update (the latest time it has
		// seen: a clock that stepped back leaves it there).
		latest = max(latest, now)
		if mem.Sweep(time.UnixMicro(latest)) > 0 {
			latest = 0
		}
		bkey, qkey, qend := s.BucketKey(key, "s"), s.BucketKey(key, "s"), int64(0)
		if lim.HasQuota() {
			start, end := lim.QuotaPeriod.Window(clock)
			qkey, qend = s.QuotaKey(key, lim.QuotaID, start), end.UnixMilli()
		}
		res := runAt(t, ctx, c, decideAtScript, []string{bkey, qkey}, 3,
			lim.Rate, lim.Burst, cost, lim.QuotaLimit, qend, lim.SoftLimitPercent, lim.Floor(), now)
		got, err := verdictOf(bkey, res, nil)
		if err != nil {
			t.Fatal(err)
		}
		where := fmt.Sprintf("seed %d quota %v step %d (%+v, cost %d, now %d)", seed, quota, step, lim, cost, now)
		compareVerdicts(t, where, got, want)
		last = want
	}
}

// compareVerdicts fails unless the Lua verdict got is the Go verdict want.
// The script's times are whole ms; the Go authority's reset time is µs, so
// it is compared rounded up to ms, as the script rounds it.
func compareVerdicts(t testing.TB, where string, got, want enforcement.Verdict) {
	t.Helper()
	wantReset := (want.ResetAfter + time.Millisecond - 1).Truncate(time.Millisecond)
	if got.Allowed != want.Allowed || got.Shed != want.Shed || got.Remaining != want.Remaining || got.RetryAfter != want.RetryAfter ||
		got.ResetAfter != wantReset || got.Warning != want.Warning || got.QuotaUsed != want.QuotaUsed ||
		got.ClockBack != want.ClockBack {
		t.Fatalf("%s (shed: Lua %v, Go %v):\n Lua allowed=%v remaining=%d retry=%v reset=%v warning=%v quota=%d back=%v\n  Go allowed=%v remaining=%d retry=%v reset=%v warning=%v quota=%d back=%v",
			where, got.Shed, want.Shed, got.Allowed, got.Remaining, got.RetryAfter, got.ResetAfter, got.Warning, got.QuotaUsed, got.ClockBack,
			want.Allowed, want.Remaining, want.RetryAfter, wantReset, want.Warning, want.QuotaUsed, want.ClockBack)
	}
	if !want.ClockBack && !got.Now.Equal(want.Now) {
		t.Fatalf("%s: Lua now %v, Go now %v", where, got.Now, want.Now)
	}
}

// goLease is lease.lua's rule on enforcement.Bucket: refill (a Take of
// nothing), then take min(want, whole tokens there) if at least a are
// there, else say when a will be (a Take of a on a copy); a return adds a
// back, capped at the burst. Every time is the Go bucket's, rounded up to ms.
func goLease(b *enforcement.Bucket, now int64, lim enforcement.Limit, mode string, a, want int64) enforcement.Grant {
	r := b.Take(now, lim.Rate, lim.Burst, 0)
	g := enforcement.Grant{ClockBack: r.ClockBack}
	whole := int64(math.Floor(r.Tokens + 1e-9))
	switch mode {
	case "lease":
		if whole >= a {
			g.Granted = min(want, whole)
			b.Take(now, lim.Rate, lim.Burst, g.Granted)
		} else {
			probe := *b
			g.RetryAfter = msOf(probe.Take(now, lim.Rate, lim.Burst, a).RetryAfterUS)
		}
	case "return":
		b.Tokens = min(float64(lim.Burst), b.Tokens+float64(a))
	}
	g.Left = int64(math.Floor(b.Tokens + 1e-9))
	probe := *b
	g.ResetAfter = msOf(probe.Take(now, lim.Rate, lim.Burst, 0).ResetAfterUS)
	return g
}

// msOf rounds µs up to whole ms, as the scripts answer.
func msOf(us int64) time.Duration {
	return (time.Duration(us)*time.Microsecond + time.Millisecond - 1).Truncate(time.Millisecond)
}

// forgetFull forgets b once it is full at its last update, as Redis does
// (see TestDecideAgreesWithGo).
func forgetFull(b *enforcement.Bucket, lim enforcement.Limit) {
	if b.Full(b.TS, lim.Rate, lim.Burst) {
		*b = enforcement.Bucket{}
	}
}

// TestLeaseAgreesWithGo: lease.lua and the same rule on the Go bucket,
// interleaved with decisions on the same bucket, agree at every step.
func TestLeaseAgreesWithGo(t *testing.T) {
	c := agreeClient(t)
	ctx := context.Background()
	s := New(c, "agreelease")
	const sequences, steps = 300, 40
	for seq := range sequences {
		rng := rand.New(rand.NewPCG(uint64(seq), 2626))
		lim := randomLimit(rng, false)
		lim.SoftLimitPercent = 0
		now := time.Now().UnixMicro()
		var b enforcement.Bucket
		bkey := s.BucketKey(fmt.Sprintf("k%d", seq), "s")
		var retry time.Duration
		left := lim.Burst
		for step := range steps {
			now += randomStep(rng, lim, retry, true)
			where := fmt.Sprintf("sequence %d step %d (rate %v burst %d, now %d)", seq, step, lim.Rate, lim.Burst, now)
			if rng.IntN(3) == 0 { // a plain decision on the same bucket
				cost := randomCost(rng, lim, left)
				want := b.Take(now, lim.Rate, lim.Burst, cost)
				res := runAt(t, ctx, c, decideAtScript, []string{bkey, bkey}, 3, lim.Rate, lim.Burst, cost, 0, 0, 0, 0, now)
				got, err := verdictOf(bkey, res, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed != want.Allowed || got.Remaining != int64(math.Floor(want.Tokens+1e-9)) {
					t.Fatalf("%s, take %d: Lua %+v, Go %+v", where, cost, got, want)
				}
				left = got.Remaining
				forgetFull(&b, lim)
				continue
			}
			mode, a, wantN := "lease", randomCost(rng, lim, left), int64(0)
			if rng.IntN(3) == 0 {
				mode, a = "return", rng.Int64N(lim.Burst+1)
			} else {
				a = max(1, a)
				wantN = a + rng.Int64N(lim.Burst)
			}
			want := goLease(&b, now, lim, mode, a, wantN)
			res := runAt(t, ctx, c, leaseAtScript, []string{bkey}, 3, lim.Rate, lim.Burst, mode, a, wantN, now)
			if len(res) != 6 {
				t.Fatalf("%s: lease script: %v", where, res)
			}
			got := enforcement.Grant{Granted: res[0], Left: res[1], RetryAfter: time.Duration(res[2]) * time.Millisecond,
				ResetAfter: time.Duration(res[3]) * time.Millisecond, ClockBack: res[5] == 1}
			if got != want {
				t.Fatalf("%s, %s %d (want %d):\n Lua %+v\n  Go %+v", where, mode, a, wantN, got, want)
			}
			retry, left = got.RetryAfter, got.Left
			forgetFull(&b, lim)
		}
	}
}

// TestStoreAgreesWithGoOnRedisTime runs the production scripts (bucket.lua
// through Store, batch.lua through Pipelined) on Redis TIME. Before each
// decision the test writes the Go bucket's state, dated its step before the
// Redis time it reads; the script's own now is the time it stores the
// bucket at, which the test reads back, so the Go bucket decides at the
// very same µs. A bucket the script found full is gone, as is one whose
// TTL (its time to refill) ended before the test read it; its now is then
// only known to lie between the Redis times read before and after (and in
// the ms it answered), and the Go bucket must give the same answer at some
// µs of that span. The next step starts that bucket afresh.
func TestStoreAgreesWithGoOnRedisTime(t *testing.T) {
	c := agreeClient(t)
	ctx := context.Background()
	p := NewPipelined(c, "agreepipe", PipelineConfig{})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = p.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ran })
	for _, a := range []struct {
		name string
		enforcement.Authority
		s *Store
	}{{"Store", New(c, "agreestore"), New(c, "agreestore")}, {"Pipelined", p, p.Store()}} {
		t.Run(a.name, func(t *testing.T) {
			for seq := range 60 {
				rng := rand.New(rand.NewPCG(uint64(seq), 15))
				lim := randomLimit(rng, false)
				key := fmt.Sprintf("k%d", seq)
				bkey := a.s.BucketKey(key, "s")
				var b enforcement.Bucket
				var last enforcement.Verdict
				last.Remaining = lim.Burst
				for step := range 20 {
					before := redisNow(t, c)
					if b.TS != 0 {
						b.TS = before - max(0, randomStep(rng, lim, last.RetryAfter, false))
						if err := c.Set(ctx, bkey, EncodeBucket(b), 0).Err(); err != nil {
							t.Fatal(err)
						}
					}
					cost := randomCost(rng, lim, last.Remaining)
					got, err := a.Take(ctx, key, "s", lim, cost)
					if err != nil {
						t.Fatal(err)
					}
					after := redisNow(t, c)
					where := fmt.Sprintf("sequence %d step %d (rate %v burst %d, cost %d)", seq, step, lim.Rate, lim.Burst, cost)
					stored, found, err := ReadBucket(ctx, c, bkey)
					if err != nil {
						t.Fatal(err)
					}
					if found {
						r := b.Take(stored.TS, lim.Rate, lim.Burst, cost)
						if got.Allowed != r.Allowed || got.Remaining != int64(math.Floor(r.Tokens+1e-9)) ||
							got.RetryAfter != msOf(r.RetryAfterUS) || got.ResetAfter != msOf(r.ResetAfterUS) || stored != b {
							t.Fatalf("%s at %d:\n Lua %+v stored %+v\n  Go %+v %+v", where, stored.TS, got, stored, r, b)
						}
					} else if !agreesWithin(b, lim, cost, got, max(before, got.Now.UnixMicro()), min(after, got.Now.UnixMicro())) {
						t.Fatalf("%s, bucket gone: Lua %+v, and no time in [%d, %d] (Redis, and the instant it answered) gives that in Go", where, got, before, after)
					} else {
						b = enforcement.Bucket{}
					}
					last = got
				}
			}
		})
	}
}

// agreesWithin reports whether the Go bucket b, deciding cost at some µs in
// [from, to], answers got.
func agreesWithin(b enforcement.Bucket, lim enforcement.Limit, cost int64, got enforcement.Verdict, from, to int64) bool {
	for now := from; now <= to; now++ {
		bb := b
		r := bb.Take(now, lim.Rate, lim.Burst, cost)
		if got.Allowed == r.Allowed && got.Remaining == int64(math.Floor(r.Tokens+1e-9)) &&
			got.RetryAfter == msOf(r.RetryAfterUS) && got.ResetAfter == msOf(r.ResetAfterUS) {
			return true
		}
	}
	return false
}

// redisNow is Redis's clock, µs.
func redisNow(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// TestQuotaWaitAfterClockStepsBack: a quota rejection's wait runs to the
// window's end from the store's clock, not from the bucket's last update,
// which is later when the clock stepped back (the wait would be early by
// the step).
func TestQuotaWaitAfterClockStepsBack(t *testing.T) {
	c := agreeClient(t)
	ctx := context.Background()
	s := New(c, "agreeback")
	lim := enforcement.Limit{Rate: 10, Burst: 1, QuotaLimit: 1, QuotaPeriod: enforcement.PeriodDay, QuotaID: "q"}
	start, end := lim.QuotaPeriod.Window(time.Now())
	var clock time.Time
	mem := enforcement.NewMemoryAuthority(func() time.Time { return clock }, 1<<20)
	bkey, qkey := s.BucketKey("k", "s"), s.QuotaKey("k", "q", start)
	now := start.Add(time.Hour).UnixMicro()
	for i, step := range []int64{0, 50_000, -2_500, 0} { // the third decision's clock is 2.5 ms behind the second's
		now += step
		clock = time.UnixMicro(now)
		want, err := mem.Take(ctx, "k", "s", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		res := runAt(t, ctx, c, decideAtScript, []string{bkey, qkey}, 3, lim.Rate, lim.Burst, 1, lim.QuotaLimit, end.UnixMilli(), 0, 0, now)
		got, err := verdictOf(bkey, res, nil)
		if err != nil {
			t.Fatal(err)
		}
		compareVerdicts(t, fmt.Sprintf("decision %d at %d", i, now), got, want)
		if i == 2 && (!got.ClockBack || got.Allowed) {
			t.Fatalf("decision 2: %+v, want a quota rejection with the clock behind", got)
		}
	}
}
