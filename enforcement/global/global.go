package global

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
)

var (
	//go:embed pool.lua
	poolLua string
	//go:embed decide.lua
	decideLua string
	//go:embed tick.lua
	tickLua string
	//go:embed fill.lua
	fillLua string
	//go:embed homelease.lua
	homeLeaseLua string
	//go:embed charge.lua
	chargeLua string

	decideScript = redisstore.NewScript(poolLua + decideLua)
	tickScript   = redisstore.NewScript(poolLua + tickLua)
	fillScript   = redisstore.NewScript(poolLua + fillLua)
	// homeLeaseScript runs at the home, for keys with a calendar quota;
	// chargeScript charges a quota there with what an escrow spent.
	homeLeaseScript = redisstore.NewScript(redisstore.LeaseSource() + homeLeaseLua)
	chargeScript    = redisstore.NewScript(chargeLua)
)

// Config configures a region's enforcement of global limits. The zero
// value of each optional field is its documented default.
type Config struct {
	Region  string // this region's name (required)
	Regions int    // how many regions share every global limit: N (≥ 1)
	// Local is the region's own Redis (the pools), Home the home region's
	// (the global buckets; in the home region, the same server). Required.
	Local redis.Scripter
	Home  Client
	// Prefix is the region's key prefix (default limits.DefaultKeyPrefix);
	// HomePrefix the home's (default the same), under which the global
	// buckets live as HomePrefix+":g" (so that they never meet the home
	// region's own regional buckets of the same key).
	Prefix, HomePrefix string
	// Member names this instance as a refill lock's holder (required).
	Member string
	// Tick is the refiller's period (default 50ms); Hold how long a pool
	// nobody asks of is kept before its tokens go back (default 250ms);
	// Window the demand's smoothing (default 200ms).
	Tick, Hold, Window time.Duration
	// Timeout is the deadline of a decision's call to the region's Redis
	// (default 100ms); LocalTimeout of the refiller's (default 250ms);
	// HomeTimeout of a call to the home (default 1s).
	Timeout, LocalTimeout, HomeTimeout time.Duration
	// BreakerFailures consecutive failed decision calls (default 5) make
	// decisions fail at once, without a call, for BreakerOpenFor (default
	// 1s); then one call probes. A dead regional Redis then costs each
	// decision nothing before the limiter's failure policy decides it.
	BreakerFailures int
	BreakerOpenFor  time.Duration
	// TTL of a pool key after its last write (default 10 minutes).
	TTL time.Duration
	// MaxKeys bounds the keys the refiller follows (default 10,000);
	// beyond it a new key is decided on its pool but not refilled here.
	MaxKeys int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Registerer receives the metrics (default: a private registry).
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

func (c *Config) defaults() error {
	switch {
	case c.Region == "":
		return errors.New("global: Config.Region is required")
	case c.Local == nil || c.Home == nil:
		return errors.New("global: Config.Local and Config.Home are required")
	case c.Member == "":
		return errors.New("global: Config.Member is required")
	}
	c.Regions = max(1, c.Regions)
	if c.Prefix == "" {
		c.Prefix = limits.DefaultKeyPrefix
	}
	if c.HomePrefix == "" {
		c.HomePrefix = c.Prefix
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Tick, 50*time.Millisecond)
	def(&c.Hold, 250*time.Millisecond)
	def(&c.Window, 200*time.Millisecond)
	def(&c.Timeout, 100*time.Millisecond)
	def(&c.BreakerOpenFor, time.Second)
	if c.BreakerFailures <= 0 {
		c.BreakerFailures = 5
	}
	def(&c.LocalTimeout, 250*time.Millisecond)
	def(&c.HomeTimeout, time.Second)
	def(&c.TTL, 10*time.Minute)
	if c.MaxKeys <= 0 {
		c.MaxKeys = 10_000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Client is what the home's Redis client must do: scripts and a probe
// (every go-redis client does).
type Client interface {
	redis.Scripter
	pinger
}

type pinger interface {
	Ping(ctx context.Context) *redis.StatusCmd
}

// Global decides global limits in one region (an enforcement.Authority
// for enforcement.Config.Global) and, in Run, keeps their pools filled
// from the home. Safe for concurrent use.
type Global struct {
	cfg  Config
	home *redisstore.Store // the global buckets, through the lease scripts
	keys sync.Map          // poolID → *keyState: what the refiller follows
	nkey atomic.Int64
	wake chan struct{} // a pool came up short: refill now

	// unreachable: the latest call to the home failed (no answer since).
	// Decisions then fall to the escrow once the pool is spent.
	unreachable atomic.Bool
	since       atomic.Int64 // unix ns of the last change of reachability
	rttNS       atomic.Int64 // smoothed round trip to the home
	poolTokens  atomic.Int64 // tokens in the pools this instance refills, as last read
	cause       atomic.Pointer[string]

	// The decisions' breaker: consecutive failures, and until when (unix
	// ns) decisions fail without a call.
	failures  atomic.Int64
	openUntil atomic.Int64

	m metrics
}

// errOpen is a decision refused by the open breaker.
var errOpen = fmt.Errorf("the region's Redis failed repeatedly: %w", enforcement.ErrBreakerOpen)

type poolID struct{ key, scope string }

// keyState is one key the refiller follows: written by decisions (lim,
// lastUse, maxCost), read and kept by the refiller alone otherwise.
type keyState struct {
	lim     atomic.Pointer[enforcement.Limit]
	lastUse atomic.Int64 // unix ns of this instance's last decision
	maxCost atomic.Int64

	// The refiller's own.
	mine       bool
	wanted     int64     // the pool's wanted counter at the last look
	lookedAt   time.Time // the store's clock at that look
	rate       float64   // smoothed demand, tokens per second
	lastDemand time.Time // when the region last asked anything of the pool
	tokens     int64
}

var _ enforcement.Authority = (*Global)(nil)

// New returns the region's enforcement of global limits. It starts
// nothing: Take works at once (on empty pools), Run refills them.
func New(cfg Config) (*Global, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	g := &Global{cfg: cfg, home: redisstore.New(cfg.Home, cfg.HomePrefix+":g"), wake: make(chan struct{}, 1)}
	g.since.Store(cfg.Now().UnixNano())
	g.m = newMetrics(cfg.Registerer, g)
	return g, nil
}

// poolKey and lockKey are a pool's keys in the region's Redis: the
// rate-limit key is the hash tag, as for its buckets, so both are in one
// Cluster slot.
func (g *Global) poolKey(key, scope string) string {
	return g.cfg.Prefix + ":{" + key + "}:gp:" + scope
}

func (g *Global) lockKey(key, scope string) string {
	return g.cfg.Prefix + ":{" + key + "}:gl:" + scope
}

// viewKey is the region's view of the key's global bucket (pool.lua),
// read by the decisions of a limit with a soft limit.
func (g *Global) viewKey(key, scope string) string {
	return g.cfg.Prefix + ":{" + key + "}:gv:" + scope
}

// Take implements enforcement.Authority: one script call on the region's
// Redis, spending from the key's pool, then (home unreachable) its escrow.
func (g *Global) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	return g.take(ctx, key, scope, lim, cost, "", 0)
}

// take is Take, or with an id Reserve: the same decision that, allowed,
// also records reservation id for ttl (reserve.lua).
func (g *Global) take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	g.follow(key, scope, lim, cost)
	escrow := "0"
	if g.unreachable.Load() {
		escrow = "1"
	}
	erate, eburst := escrowOf(lim, g.cfg.Regions)
	retry := g.poolRetryMS(lim, cost)
	if until := g.openUntil.Load(); until != 0 {
		if time.Now().UnixNano() < until || !g.openUntil.CompareAndSwap(until, 0) {
			return enforcement.Verdict{}, errOpen // one caller probes once it is time
		}
	}
	script, keys := decideScript, []string{g.poolKey(key, scope)}
	args := []any{cost, escrow, erate, eburst, retry, g.cfg.TTL.Milliseconds()}
	if id != "" {
		script, keys, args = reserveScript, append(keys, g.recordKey(key, id)), append(args, max(1, ttl.Milliseconds()))
	}
	if lim.SoftLimitPercent > 0 {
		keys = append(keys, g.viewKey(key, scope))
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	res, err := script.Run(ctx, g.cfg.Local, keys, args...).Int64Slice()
	if err != nil {
		g.m.localErrors.Inc()
		if g.failures.Add(1) >= int64(g.cfg.BreakerFailures) {
			g.openUntil.Store(time.Now().Add(g.cfg.BreakerOpenFor).UnixNano())
		}
		return enforcement.Verdict{}, fmt.Errorf("global pool of %q in region %s: %w", scope, g.cfg.Region, err)
	}
	if g.failures.Load() != 0 {
		g.failures.Store(0)
	}
	if len(res) != 9 {
		g.m.localErrors.Inc()
		return enforcement.Verdict{}, fmt.Errorf("global pool script: %d values, want 9", len(res))
	}
	v := enforcement.Verdict{
		Allowed:    res[0] == 1,
		Regional:   res[1] == 1,
		Remaining:  res[2],
		RetryAfter: time.Duration(res[3]) * time.Millisecond,
		Now:        time.UnixMicro(res[4]),
		QuotaUsed:  res[5],
		// ResetAfter 0: a pool is refilled in blocks, not at a rate, so
		// the local tier must not model it as a bucket.
	}
	if lim.SoftLimitPercent > 0 {
		v.Warning = softLimitReached(lim, g.cfg.Regions, v, res[6], res[7], time.Duration(res[8])*time.Microsecond)
	}
	if v.Regional {
		g.m.byRegional.Inc()
	} else {
		g.m.byGlobal.Inc()
		if !v.Allowed {
			g.poke()
		}
	}
	return v, nil
}

// poolRetryMS is how long a pool's rejection tells the caller to wait
// (and the limiter's local tier to reject without asking): what the global
// bucket refills for the cost, the soonest an ideal bucket would have it,
// but no longer than the refiller's next lease (a tick and a round trip to
// the home; a pool that comes up short pokes it). An empty pool does not
// mean an empty global bucket: a cold pool, or demand that has just moved
// here, has budget at the home, and a longer wait would keep the local
// tier from asking the pool again, so the refiller, which leases for the
// demand the pool sees, would never see it (a key of 1/s would be held
// to a token a second whatever its burst).
func (g *Global) poolRetryMS(lim enforcement.Limit, cost int64) int64 {
	refill := math.Ceil(float64(max(cost, 1)) / lim.Rate * 1000)
	lease := float64(g.cfg.Tick+time.Duration(g.rttNS.Load())) / float64(time.Millisecond)
	return int64(max(1, min(refill, math.Ceil(lease))))
}

// follow records a decision on (key, scope) for the refiller.
func (g *Global) follow(key, scope string, lim enforcement.Limit, cost int64) {
	id := poolID{key, scope}
	v, ok := g.keys.Load(id)
	if !ok {
		if g.nkey.Load() >= int64(g.cfg.MaxKeys) {
			return
		}
		ks := &keyState{}
		l := lim
		ks.lim.Store(&l)
		var loaded bool
		if v, loaded = g.keys.LoadOrStore(id, ks); !loaded {
			g.nkey.Add(1)
			g.poke()
		}
	}
	ks := v.(*keyState)
	if p := ks.lim.Load(); *p != lim {
		l := lim
		ks.lim.Store(&l)
	}
	ks.lastUse.Store(g.cfg.Now().UnixNano())
	for c := ks.maxCost.Load(); cost > c && !ks.maxCost.CompareAndSwap(c, cost); c = ks.maxCost.Load() {
	}
}

func (g *Global) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Status is the region's view of its global budgets, for /readyz.
type Status struct {
	Name string `json:"name"`
	// Global is "ok" while the home answers, "unreachable" while it does
	// not (global limits then decide on the escrow once the pools are
	// spent). Never a readiness failure.
	Global  string    `json:"global"`
	Since   time.Time `json:"since"`   // of the latest change of Global
	Regions int       `json:"regions"` // N
	// Keys is how many global keys this instance follows; PoolTokens the
	// tokens held in the pools it refills (as last read).
	Keys       int     `json:"keys"`
	PoolTokens int64   `json:"pool_tokens"`
	HomeRTTMS  float64 `json:"home_rtt_ms"`
	Cause      string  `json:"cause,omitempty"` // why the home is unreachable
}

// Status reports the region's state.
func (g *Global) Status() Status {
	s := Status{Name: g.cfg.Region, Global: "ok", Regions: g.cfg.Regions, Since: time.Unix(0, g.since.Load()).UTC(),
		Keys: int(g.nkey.Load()), PoolTokens: g.poolTokens.Load(), HomeRTTMS: float64(g.rttNS.Load()) / 1e6}
	if g.unreachable.Load() {
		s.Global = "unreachable"
		if c := g.cause.Load(); c != nil {
			s.Cause = *c
		}
	}
	return s
}

// Reachable reports whether the home answered the latest call.
func (g *Global) Reachable() bool { return !g.unreachable.Load() }

// homeResult records the outcome of a call to the home.
func (g *Global) homeResult(err error, took time.Duration) {
	if err != nil {
		g.m.homeErrors.Inc()
		msg := err.Error()
		g.cause.Store(&msg)
		if !g.unreachable.Swap(true) {
			g.since.Store(g.cfg.Now().UnixNano())
			g.cfg.Log.Warn("home region unreachable: global limits decide on their pools, then on the escrow", "region", g.cfg.Region, "err", err)
		}
		return
	}
	prev := g.rttNS.Load()
	if prev == 0 {
		g.rttNS.Store(int64(took))
	} else {
		g.rttNS.Store(prev + (int64(took)-prev)/4)
	}
	if g.unreachable.Swap(false) {
		g.since.Store(g.cfg.Now().UnixNano())
		g.cfg.Log.Info("home region reachable again: global limits rejoin their global budgets", "region", g.cfg.Region)
	}
}
