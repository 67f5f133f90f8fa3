// Command loadgen drives rate-limit decisions and measures them: through
// POST /check of one or several limiter processes (-url), or in-process
// against Redis with several independent limiter instances (-redis, with
// optional token leasing), at a fixed rate (-rate, open loop: sends the
// workers cannot start in time are counted as dropped) or flat out
// (-rate 0). Keys follow a uniform, Zipf or "one key is 40%"
// distribution. It reports throughput, an HDR latency histogram
// (p50/p90/p99/p99.9/max), decisions by source, Redis operations per second
// (when -redis-stats is given) and, per key, admitted against the limit.
//
//	loadgen -url http://127.0.0.1:8080/check -dist zipf -duration 10s -conns 32
//	loadgen -redis 127.0.0.1:6379 -instances 4 -lease -dist one -rate 2000 -limit-rate 1000 -limit-burst 1000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ratewarden/ratewarden/internal/redislog"
)

type options struct {
	urls         []string
	redisAddr    string // in-process mode
	redisStats   string // Redis to read INFO commandstats from (defaults to redisAddr)
	instances    int
	lease        bool
	leaseBlock   int64
	leaseHot     float64
	leaseTimeout time.Duration
	pipeline     bool
	// fromSchedule: at a fixed rate, latency counts from when the request
	// was due (open model: a request held up by the load tool or a busy
	// machine counts as late), not from when it was sent.
	fromSchedule bool

	duration time.Duration
	rate     float64 // decisions per second in total; 0 = flat out
	conns    int

	keys      int
	dist      string
	zipfS     float64
	hotShare  float64
	keyPrefix string
	scope     string
	tier      string

	limitRate  float64
	limitBurst int64

	jsonOut string
	label   string
}

func main() {
	o := options{}
	var urls string
	flag.StringVar(&urls, "url", "", "comma-separated /check URLs (requests go round robin over them)")
	flag.StringVar(&o.redisAddr, "redis", "", "in-process mode: decide with limiter instances built in this process against this Redis")
	flag.StringVar(&o.redisStats, "redis-stats", "", "Redis address whose INFO commandstats gives Redis operations per second (default: -redis)")
	flag.IntVar(&o.instances, "instances", 1, "in-process mode: independent limiter instances, each with its own Redis connection pool")
	flag.BoolVar(&o.lease, "lease", false, "in-process mode: token leasing for hot keys")
	flag.Int64Var(&o.leaseBlock, "lease-block", 100, "in-process mode: tokens per lease")
	flag.Float64Var(&o.leaseHot, "lease-hot", 0, "in-process mode: decisions per second per instance that make a key hot (0 = the lease package's default)")
	flag.DurationVar(&o.leaseTimeout, "lease-timeout", 100*time.Millisecond, "in-process mode: deadline of a lease call (a failed lease passes the key through for a second)")
	flag.BoolVar(&o.pipeline, "pipeline", false, "in-process mode: auto-pipelined shared tier")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long to drive load")
	flag.Float64Var(&o.rate, "rate", 0, "decisions per second in total (0 = flat out)")
	flag.IntVar(&o.conns, "conns", 32, "concurrent requests in flight")
	flag.IntVar(&o.keys, "keys", 10000, "number of distinct keys")
	flag.StringVar(&o.dist, "dist", "uniform", "key distribution: uniform | zipf | hot40 | one")
	flag.Float64Var(&o.zipfS, "zipf-s", 1.1, "Zipf exponent (> 1)")
	flag.Float64Var(&o.hotShare, "hot-share", 0.4, "hot40: the hot key's share of requests")
	flag.StringVar(&o.keyPrefix, "key-prefix", "acct_", "key prefix; key i is prefix+i, the hot key is prefix+\"hot\"")
	flag.StringVar(&o.scope, "scope", "api", "scope of every request")
	flag.StringVar(&o.tier, "tier", "", "tier of every request (empty: the policy's)")
	flag.Float64Var(&o.limitRate, "limit-rate", 0, "the keys' refill rate, tokens/s (for the admitted-vs-limit report; required in-process)")
	flag.Int64Var(&o.limitBurst, "limit-burst", 0, "the keys' burst (in-process: required; HTTP: taken from responses when 0)")
	flag.StringVar(&o.jsonOut, "json", "", "also write the result as JSON to this file")
	flag.StringVar(&o.label, "label", "", "a label for the result")
	flag.BoolVar(&o.fromSchedule, "from-schedule", false, "with -rate: measure latency from when each request was due (open model), not from its send")
	flag.Parse()
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.urls = append(o.urls, u)
		}
	}
	if o.redisStats == "" {
		o.redisStats = o.redisAddr
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	redislog.Use(log) // go-redis's own lines as JSON too, like every other log line
	if err := o.validate(); err != nil {
		log.Error("invalid flags", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o)
	if err != nil {
		log.Error("loadgen failed", "err", err)
		os.Exit(1)
	}
	fmt.Print(res.Text())
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(o.jsonOut, append(b, '\n'), 0o644); err != nil {
			log.Error("write json", "err", err)
			os.Exit(1)
		}
	}
}

func (o *options) validate() error {
	switch {
	case len(o.urls) == 0 && o.redisAddr == "":
		return fmt.Errorf("-url or -redis is required")
	case len(o.urls) > 0 && o.redisAddr != "":
		return fmt.Errorf("-url and -redis are exclusive")
	case o.redisAddr != "" && (o.limitRate <= 0 || o.limitBurst <= 0):
		return fmt.Errorf("in-process mode needs -limit-rate and -limit-burst")
	case o.conns < 1 || o.keys < 1 || o.instances < 1 || o.duration <= 0 || o.rate < 0:
		return fmt.Errorf("-conns, -keys, -instances and -duration must be positive, -rate ≥ 0")
	case o.dist != "uniform" && o.dist != "zipf" && o.dist != "hot40" && o.dist != "one":
		return fmt.Errorf("-dist must be uniform, zipf, hot40 or one, got %q", o.dist)
	case o.dist == "zipf" && o.zipfS <= 1:
		return fmt.Errorf("-zipf-s must be > 1")
	}
	return nil
}
