package testenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/wanproxy"
)

// GlobalStoreVar is the limiter's variable naming the Redis that holds the
// global budgets (the home region's, reached over the WAN); the harness
// sets it to the address of the region's link to the home.
const GlobalStoreVar = "GLOBAL_REDIS_ADDRS"

// TestbedDelays are the one-way delays of make regions-up between regions
// a, b and c (either order).
func TestbedDelays() map[[2]string]time.Duration {
	return map[[2]string]time.Duration{
		{"a", "b"}: 15 * time.Millisecond,
		{"a", "c"}: 40 * time.Millisecond,
		{"b", "c"}: 75 * time.Millisecond,
	}
}

// RegionsConfig describes a multi-region test bed on loopback.
type RegionsConfig struct {
	// Names are the regions (default a, b, c).
	Names []string
	// Home holds every global budget (default Names[0]).
	Home string
	// Delays are the one-way delays between two regions, in either order
	// (default TestbedDelays; a pair it does not name has no delay).
	Delays map[[2]string]time.Duration
	// Jitter and Loss apply to every link (wanproxy.Config); Jitter
	// defaults to 0.1, a negative Jitter is none.
	Jitter, Loss float64
	// LimiterBin is the limiter binary (Binary(tb, "cmd/limiter"));
	// empty starts no limiter.
	LimiterBin string
	// Policy is the YAML every limiter enforces.
	Policy string
	// Instances is the number of limiter processes per region (default 1).
	Instances int
	// Env adds variables to a region's limiters, after the harness's own.
	Env func(region string) []string
	// Kafka, when set, is the central Kafka every region's limiters emit
	// their decision events to (KAFKA_BROKERS, KAFKA_TOPIC), as
	// docs/regions-usage.md deploys the decisions topic. It is reached
	// directly, not through a link: a Kafka client goes to the address the
	// broker advertises. Nil = the limiters emit nothing.
	Kafka *Kafka
}

// Regions is a running test bed: per region a redis-server and limiter
// processes, and between every two regions a wanproxy link in each
// direction to the other's Redis.
type Regions struct {
	cfg     RegionsConfig
	dir     string
	Net     *wanproxy.Net
	regions map[string]*Region
	cancel  context.CancelFunc
	serving sync.WaitGroup
}

// Region is one region of a test bed.
type Region struct {
	Name  string
	Redis *Redis
	// reach[o] is where this region reaches region o's Redis (its link).
	reach map[string]string
	rs    *Regions

	mu       sync.Mutex
	limiters []*Limiter
	started  int
}

// StartRegions starts a test bed for the test and stops every process of
// it at cleanup; when the test failed it logs the tail of every limiter's
// output.
func StartRegions(tb testing.TB, cfg RegionsConfig) *Regions {
	tb.Helper()
	SkipShort(tb)
	rs, err := NewRegions(tb.TempDir(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, name := range rs.cfg.Names {
				for _, l := range rs.regions[name].Limiters() {
					tb.Logf("%s, last lines:\n%s", l.Name, l.LogTail(30))
				}
			}
		}
		rs.Close()
	})
	FailOnRaceReport(tb, "a limiter of the test bed", func() string { return rs.logs() })
	return rs
}

// logs is every log the test bed wrote (its limiters', stopped ones
// included), concatenated.
func (rs *Regions) logs() string {
	var b strings.Builder
	_ = filepath.WalkDir(rs.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") {
			if data, err := os.ReadFile(p); err == nil {
				b.Write(data)
			}
		}
		return nil
	})
	return b.String()
}

// NewRegions starts a test bed with its files under dir. The caller must
// Close it; it is for tools, tests use StartRegions.
func NewRegions(dir string, cfg RegionsConfig) (*Regions, error) {
	if len(cfg.Names) == 0 {
		cfg.Names = []string{"a", "b", "c"}
	}
	if cfg.Home == "" {
		cfg.Home = cfg.Names[0]
	}
	if !slices.Contains(cfg.Names, cfg.Home) {
		return nil, fmt.Errorf("home region %q is not one of %v", cfg.Home, cfg.Names)
	}
	if cfg.Delays == nil {
		cfg.Delays = TestbedDelays()
	}
	switch {
	case cfg.Jitter == 0:
		cfg.Jitter = 0.1
	case cfg.Jitter < 0:
		cfg.Jitter = 0
	}
	if cfg.Instances == 0 {
		cfg.Instances = 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &Regions{cfg: cfg, dir: dir, regions: map[string]*Region{}, cancel: cancel}
	ok := false
	defer func() {
		if !ok {
			rs.Close()
		}
	}()
	for _, name := range cfg.Names {
		rdir := filepath.Join(dir, name)
		if err := os.MkdirAll(rdir, 0o755); err != nil {
			return nil, err
		}
		r, err := NewRedis(rdir)
		if err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		rs.regions[name] = &Region{Name: name, Redis: r, reach: map[string]string{}, rs: rs}
	}
	var links []*wanproxy.Link
	for _, from := range cfg.Names {
		for _, to := range cfg.Names {
			if from == to {
				continue
			}
			l, err := wanproxy.New(wanproxy.Config{
				Name: from + "-" + to, From: from, To: to, Target: rs.regions[to].Redis.Addr(),
				Delay: rs.Delay(from, to), Jitter: cfg.Jitter, Loss: cfg.Loss,
			})
			if err != nil {
				return nil, err
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			rs.regions[from].reach[to] = ln.Addr().String()
			links = append(links, l)
			rs.serving.Go(func() { _ = l.Serve(ctx, ln) })
		}
	}
	rs.Net = wanproxy.NewNet(links...)
	if cfg.LimiterBin != "" {
		if err := os.WriteFile(rs.policyPath(), []byte(cfg.Policy), 0o644); err != nil {
			return nil, err
		}
		for _, name := range cfg.Names {
			if err := rs.regions[name].StartLimiters(cfg.Instances); err != nil {
				return nil, err
			}
		}
	}
	ok = true
	return rs, nil
}

func (rs *Regions) policyPath() string { return filepath.Join(rs.dir, "policy.yaml") }

// Delay is the one-way delay between two regions.
func (rs *Regions) Delay(a, b string) time.Duration {
	if d, ok := rs.cfg.Delays[[2]string{a, b}]; ok {
		return d
	}
	return rs.cfg.Delays[[2]string{b, a}]
}

// Names are the regions, in RegionsConfig order; Home the home region.
func (rs *Regions) Names() []string { return slices.Clone(rs.cfg.Names) }
func (rs *Regions) Home() string    { return rs.cfg.Home }

// Region returns the region named name (nil when there is none).
func (rs *Regions) Region(name string) *Region { return rs.regions[name] }

// Cut cuts every link of region (a blackhole); Heal heals them.
func (rs *Regions) Cut(region string)  { rs.Net.CutRegion(region) }
func (rs *Regions) Heal(region string) { rs.Net.HealRegion(region) }

// Close stops every limiter (SIGTERM), the links and every redis-server.
// Safe to call more than once.
func (rs *Regions) Close() {
	var wg sync.WaitGroup
	for _, r := range rs.regions {
		wg.Go(r.StopLimiters)
	}
	wg.Wait()
	rs.cancel()
	rs.serving.Wait()
	for _, r := range rs.regions {
		r.Redis.Close()
	}
}

// Reach is where this region reaches region other's Redis: its own
// Redis's address for itself, else its link's.
func (r *Region) Reach(other string) string {
	if other == r.Name {
		return r.Redis.Addr()
	}
	return r.reach[other]
}

// RegionHomeTimeout is the harness's LIMITER_REGION_HOME_TIMEOUT: how
// long a cut region's limiters may take to notice the cut (the link
// blackholes) before they decide on the escrow.
func RegionHomeTimeout() time.Duration { return Timeout(2 * time.Second) }

// LimiterEnv is the environment the harness gives this region's limiters
// (before RegionsConfig.Env's).
func (r *Region) LimiterEnv() []string {
	env := []string{
		"LIMITER_REGION=" + r.Name,
		"LIMITER_REGIONS=" + strings.Join(r.rs.cfg.Names, ","),
		"REDIS_ADDRS=" + r.Redis.Addr(),
		GlobalStoreVar + "=" + r.Reach(r.rs.cfg.Home),
		"POLICY_FILE=" + r.rs.policyPath(),
		"LIMITER_GRPC_ADDR=", // off: the regions' limiters would race for its default port
		// A loaded machine's scheduling must not turn a test's decisions
		// degraded: the tests are about the limit, not about latency.
		// Nor may a stall of the home's link put a region on its escrow:
		// only a cut (Cut, Heal) does that in these tests.
		"LIMITER_STORE_TIMEOUT=" + Timeout(2*time.Second).String(),
		"LIMITER_REGION_HOME_TIMEOUT=" + RegionHomeTimeout().String(),
	}
	if k := r.rs.cfg.Kafka; k != nil {
		env = append(env, "KAFKA_BROKERS="+k.Addr(), "KAFKA_TOPIC="+k.Topic())
	}
	return env
}

// StartLimiters starts n more limiter processes in the region.
func (r *Region) StartLimiters(n int) error {
	for range n {
		r.mu.Lock()
		r.started++
		name := fmt.Sprintf("limiter-%s%d", r.Name, r.started)
		r.mu.Unlock()
		env := append(r.LimiterEnv(), "LIMITER_INSTANCE_ID="+name)
		if r.rs.cfg.Env != nil {
			env = append(env, r.rs.cfg.Env(r.Name)...)
		}
		l, err := StartLimiterProcess(name, r.rs.cfg.LimiterBin, filepath.Join(r.rs.dir, r.Name, name+".log"), env)
		if err != nil {
			return fmt.Errorf("region %s: %w", r.Name, err)
		}
		r.mu.Lock()
		r.limiters = append(r.limiters, l)
		r.mu.Unlock()
	}
	return nil
}

// Limiters are the region's running limiters.
func (r *Region) Limiters() []*Limiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.limiters)
}

// Limiter is the region's first running limiter (nil when none runs).
func (r *Region) Limiter() *Limiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.limiters) == 0 {
		return nil
	}
	return r.limiters[0]
}

// StopLimiters ends every limiter of the region with SIGTERM (SIGKILL
// after 10 s) and forgets them.
func (r *Region) StopLimiters() { r.endLimiters(func(l *Limiter) { l.Stop(10 * time.Second) }) }

// KillLimiters ends every limiter of the region with SIGKILL: a crash.
func (r *Region) KillLimiters() { r.endLimiters((*Limiter).Kill) }

func (r *Region) endLimiters(end func(*Limiter)) {
	r.mu.Lock()
	ls := r.limiters
	r.limiters = nil
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() { end(l) })
	}
	wg.Wait()
}

// Kill ends the whole region at once: its limiters and its Redis, with
// SIGKILL (a region lost with everything it held).
func (r *Region) Kill() {
	r.KillLimiters()
	r.Redis.Close()
}

// ErrNoLimiter is Check's error when the region runs no limiter.
var ErrNoLimiter = errors.New("no limiter runs in the region")

// Check sends one /check to the region's first limiter.
func (r *Region) Check(key, scope string, cost int) (Decision, error) {
	l := r.Limiter()
	if l == nil {
		return Decision{}, fmt.Errorf("region %s: %w", r.Name, ErrNoLimiter)
	}
	return l.Check(key, scope, cost)
}

// String is the region's name and limiters, for logs.
func (r *Region) String() string {
	var urls []string
	for _, l := range r.Limiters() {
		urls = append(urls, l.URL)
	}
	return r.Name + " [" + strings.Join(urls, " ") + "] redis " + strconv.Itoa(r.Redis.Port)
}
