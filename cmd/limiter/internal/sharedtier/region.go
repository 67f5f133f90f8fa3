package sharedtier

// Regions: LIMITER_REGION names this limiter's region, LIMITER_REGIONS
// every region (N, the escrow's divisor), GLOBAL_REDIS_* the home region's
// Redis that keeps the global budgets (the same variables as REDIS_*).
// Empty LIMITER_REGION is a one-region deployment: nothing of this runs.

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
)

// RegionConfig is the limiter's place among regions.
type RegionConfig struct {
	Region      string             // LIMITER_REGION; "" = one region, today's code path
	Regions     []string           // LIMITER_REGIONS: every region, this one among them
	GlobalRedis redisclient.Config // GLOBAL_REDIS_*: the home region's Redis
	// HomeTimeout (LIMITER_REGION_HOME_TIMEOUT) bounds each call to the
	// home; one that fails puts the region on its escrow until the next
	// answer, so it is the longest stall taken for a cut.
	HomeTimeout time.Duration
}

// DefaultHomeTimeout is LIMITER_REGION_HOME_TIMEOUT's default.
const DefaultHomeTimeout = time.Second

// regionName is what LIMITER_REGION and each LIMITER_REGIONS entry may be.
var regionName = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

// RegionsFromEnv reads LIMITER_REGION, LIMITER_REGIONS and GLOBAL_REDIS_*,
// recording each problem on e; local is the region's own Redis (REDIS_*).
func RegionsFromEnv(e *envconfig.Reader, local redisclient.Config) RegionConfig {
	var c RegionConfig
	c.Region = e.String("LIMITER_REGION", "")
	c.Regions = e.List("LIMITER_REGIONS")
	c.GlobalRedis = redisclient.FromEnvPrefix(e, "GLOBAL_REDIS", limits.DefaultKeyPrefix)
	c.HomeTimeout = e.Duration("LIMITER_REGION_HOME_TIMEOUT", DefaultHomeTimeout, 100*time.Millisecond, 30*time.Second)
	if c.Region != "" && !regionName.MatchString(c.Region) {
		e.Fail("LIMITER_REGION", "%q is not a region name (1 to 32 of a-z, 0-9 and '-')", truncateValue(c.Region))
	}
	for i, r := range c.Regions {
		switch {
		case !regionName.MatchString(r):
			e.Fail("LIMITER_REGIONS", "%q is not a region name (1 to 32 of a-z, 0-9 and '-')", truncateValue(r))
		case slices.Contains(c.Regions[:i], r):
			e.Fail("LIMITER_REGIONS", "names region %q twice", r)
		}
	}
	switch {
	case c.Region == "" && len(c.Regions) > 0:
		e.Fail("LIMITER_REGIONS", "is set while LIMITER_REGION is empty: name this limiter's region, or unset both for a one-region deployment")
	case c.Region == "" && c.GlobalRedis.Enabled():
		e.Fail("GLOBAL_REDIS_ADDRS", "is set while LIMITER_REGION is empty: the home Redis serves regions only")
	case c.Region == "":
	case len(c.Regions) == 0:
		e.Fail("LIMITER_REGIONS", "is empty while LIMITER_REGION is %q: list every region (comma-separated)", c.Region)
	case !slices.Contains(c.Regions, c.Region):
		e.Fail("LIMITER_REGIONS", "does not name LIMITER_REGION %q", c.Region)
	}
	if c.Region != "" && !c.GlobalRedis.Enabled() {
		e.Fail("GLOBAL_REDIS_ADDRS", "is empty while LIMITER_REGION is %q: name the home region's Redis (in the home region, its own)", c.Region)
	}
	if c.Region != "" && !local.Enabled() {
		e.Fail("REDIS_ADDRS", "is empty while LIMITER_REGION is %q: a region keeps its pools of the global budgets in its own Redis", c.Region)
	}
	return c
}

// truncateValue shortens a bad value for an error message.
func truncateValue(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Region is this limiter's part in a deployment of several regions: the
// enforcement of global limits (enforcement/global) and its client of the
// home's Redis. Nil in a one-region deployment; its methods take nil.
type Region struct {
	g      *global.Global
	auth   enforcement.Authority // g, as chain builds it: neither split nor leased
	stages []string
	home   *redisclient.Client
	n      int      // regions sharing a global limit
	names  []string // LIMITER_REGIONS
}

// BuildRegion connects the home's Redis and registers the refiller, after
// the stores (so it stops before their clients close) and the home
// client's release before it. Nil, nil when LIMITER_REGION is empty.
//
// Its decisions take the tier's breaker settings and a deadline of
// GlobalDeadline(StoreTimeout).
func (t *Tier) BuildRegion(g *lifecycle.Group, cfg RegionConfig, member string, reg prometheus.Registerer, log *slog.Logger) (*Region, error) {
	if cfg.Region == "" {
		return nil, nil
	}
	// A call to the home crosses the WAN: HomeTimeout to dial and per
	// read or write (the refiller's own deadline, the same, bounds each
	// call), never retried (a lease that may have run must not run twice).
	home, err := cfg.GlobalRedis.Open(redisclient.Options{Timeout: cfg.HomeTimeout, MaxRetries: -1, PoolSize: 4})
	if err != nil {
		return nil, fmt.Errorf("GLOBAL_REDIS_ADDRS: %w", err)
	}
	g.OnStop("home redis client", func(context.Context) error { return home.Close() })
	glob, err := global.New(global.Config{
		Region: cfg.Region, Regions: len(cfg.Regions),
		Local: t.rdb, Home: home,
		Prefix: t.cfg.Redis.KeyPrefix, HomePrefix: cfg.GlobalRedis.KeyPrefix,
		Member:          member,
		Timeout:         GlobalDeadline(t.cfg.StoreTimeout),
		HomeTimeout:     cfg.HomeTimeout,
		BreakerFailures: t.cfg.BreakerFailures,
		BreakerOpenFor:  t.cfg.BreakerOpenFor,
		Registerer:      reg, Log: log.With("region", cfg.Region),
	})
	if err != nil {
		return nil, err
	}
	g.Add("global refiller", glob.Run)
	log.Info("region: global limits are decided from this region's pools of the home's global budgets",
		"region", cfg.Region, "regions", cfg.Regions, "home", cfg.GlobalRedis.Addrs)
	// The regions' chain, by the same code as the shared tier's: global
	// limits are decided whole from the region's pool (no split, no lease).
	b := chain(chainSpec{bottom: glob, stages: []string{"global"}})
	auth, stages := b.auth, b.stages
	return &Region{g: glob, auth: auth, stages: stages, home: home, n: len(cfg.Regions), names: cfg.Regions}, nil
}

// Authority is what decides global limits (a nil interface when none).
func (r *Region) Authority() enforcement.Authority {
	if r == nil {
		return nil
	}
	return r.auth
}

// Stages are the regions' chain's stage names (nil without regions).
func (r *Region) Stages() []string {
	if r == nil {
		return nil
	}
	return r.stages
}

// Count is N, the regions sharing a global limit (1 without regions).
func (r *Region) Count() int {
	if r == nil {
		return 1
	}
	return max(1, r.n)
}

// Status is the region block of /readyz (nil without regions): the
// home's reachability is reported, never a readiness failure (other
// regions, and this one on its escrow, keep deciding).
func (r *Region) Status() *global.Status {
	if r == nil {
		return nil
	}
	s := r.g.Status()
	return &s
}

// Inspect is this region's read of a global key for support's inspect:
// its pool here and its global bucket at the home (false without
// regions).
func (r *Region) Inspect(ctx context.Context, key, scope string, lim enforcement.Limit) (global.View, bool) {
	if r == nil {
		return global.View{}, false
	}
	v := r.g.Inspect(ctx, key, scope, lim)
	v.Regions = r.names
	return v, true
}
