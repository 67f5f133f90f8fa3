package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
)

// outcome of one decision.
type outcome struct {
	allowed bool
	source  string
	limit   int64
}

// target decides for key index k; worker is the caller's index.
type target interface {
	decide(ctx context.Context, worker, k int) (outcome, error)
	close(ctx context.Context) (leaseStats *lease.Stats)
}

func keyName(o *options, k int) string {
	if k == o.keys {
		return o.keyPrefix + "hot"
	}
	return o.keyPrefix + strconv.Itoa(k)
}

// chooser picks key indexes: 0..keys-1, and keys for the hot key.
type chooser func() int

func newChooser(o *options, seed uint64) chooser {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	switch o.dist {
	case "zipf":
		z := rand.NewZipf(rng, o.zipfS, 1, uint64(o.keys-1))
		return func() int { return int(z.Uint64()) }
	case "hot40":
		return func() int {
			if rng.Float64() < o.hotShare {
				return o.keys
			}
			return rng.IntN(o.keys)
		}
	case "one":
		return func() int { return o.keys }
	}
	return func() int { return rng.IntN(o.keys) }
}

// ---- HTTP target ----

type httpTarget struct {
	o      *options
	client *http.Client
	bodies [][]byte
	bufs   []bytes.Buffer
}

func newHTTPTarget(o *options) *httpTarget {
	t := &httpTarget{o: o, client: &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns: o.conns * 2, MaxIdleConnsPerHost: o.conns, MaxConnsPerHost: o.conns,
			DisableCompression: true, IdleConnTimeout: time.Minute,
		},
	}, bufs: make([]bytes.Buffer, o.conns)}
	for k := 0; k <= o.keys; k++ {
		b := []byte(`{"key":` + strconv.Quote(keyName(o, k)) + `,"scope":` + strconv.Quote(o.scope))
		if o.tier != "" {
			b = append(b, `,"tier":`+strconv.Quote(o.tier)...)
		}
		t.bodies = append(t.bodies, append(b, '}'))
	}
	return t
}

func (t *httpTarget) decide(ctx context.Context, worker, k int) (outcome, error) {
	url := t.o.urls[(worker+k)%len(t.o.urls)]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(t.bodies[k]))
	if err != nil {
		return outcome{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := t.client.Do(req)
	if err != nil {
		return outcome{}, err
	}
	buf := &t.bufs[worker]
	buf.Reset()
	_, err = buf.ReadFrom(res.Body)
	res.Body.Close()
	if err != nil {
		return outcome{}, err
	}
	if res.StatusCode != http.StatusOK {
		return outcome{}, fmt.Errorf("status %d: %s", res.StatusCode, buf.Bytes())
	}
	b := buf.Bytes()
	out := outcome{allowed: bytes.Contains(b, []byte(`"allowed":true`))}
	if i := bytes.Index(b, []byte(`"source":"`)); i >= 0 {
		rest := b[i+10:]
		if j := bytes.IndexByte(rest, '"'); j >= 0 {
			out.source = string(rest[:j])
		}
	}
	if i := bytes.Index(b, []byte(`"limit":`)); i >= 0 {
		rest := b[i+8:]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		out.limit, _ = strconv.ParseInt(string(rest[:j]), 10, 64)
	}
	return out, nil
}

func (t *httpTarget) close(context.Context) *lease.Stats {
	t.client.CloseIdleConnections()
	return nil
}

// ---- in-process target ----

type fixedPolicy struct{ lim enforcement.Limit }

func (p fixedPolicy) Resolve(_, _, tier string) (enforcement.Resolved, error) {
	return enforcement.Resolved{Limit: p.lim, Policy: "loadgen", Tier: tier, Cost: 1}, nil
}

type inprocTarget struct {
	o      *options
	keys   []string
	lims   []*enforcement.Limiter
	leases []*lease.Authority
	// stopLeases end each lease's Run (its sweeper), which returns the
	// tokens it holds.
	stopLeases []func() error
	stops      []func() // the pipelined stores' Run: cancel and wait
	clients    []*redis.Client
}

func newInprocTarget(ctx context.Context, o *options) (*inprocTarget, error) {
	t := &inprocTarget{o: o}
	for k := 0; k <= o.keys; k++ {
		t.keys = append(t.keys, keyName(o, k))
	}
	lim := enforcement.Limit{Rate: o.limitRate, Burst: o.limitBurst}
	for i := 0; i < o.instances; i++ {
		c := redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: max(8, o.conns/o.instances+4),
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.clients = append(t.clients, c)
		store := redisstore.New(c, "rl")
		if err := store.Preload(ctx); err != nil {
			return nil, err
		}
		var auth enforcement.Authority = store
		if o.pipeline {
			p := redisstore.NewPipelined(c, "rl", redisstore.PipelineConfig{})
			pctx, stop := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { defer close(ran); _ = p.Run(pctx) }()
			t.stops = append(t.stops, func() { stop(); <-ran })
			auth = p
		}
		if o.lease {
			la := lease.New(auth, store, lease.Config{Block: o.leaseBlock, MaxBlockFraction: 1, HotOpsPerSec: o.leaseHot, Timeout: o.leaseTimeout})
			t.leases = append(t.leases, la)
			lctx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- la.Run(lctx) }()
			t.stopLeases = append(t.stopLeases, func() error { stop(); return <-done })
			auth = la
		}
		l, err := enforcement.New(enforcement.Config{Authority: auth, Policy: fixedPolicy{lim}, ExpectedInstances: o.instances})
		if err != nil {
			return nil, err
		}
		t.lims = append(t.lims, l)
	}
	return t, nil
}

func (t *inprocTarget) decide(ctx context.Context, worker, k int) (outcome, error) {
	d, err := t.lims[worker%len(t.lims)].Check(ctx, enforcement.Request{Key: t.keys[k], Scope: t.o.scope, Tier: t.o.tier})
	if err != nil {
		return outcome{}, err
	}
	return outcome{allowed: d.Allowed, source: d.Source.String(), limit: d.Limit}, nil
}

func (t *inprocTarget) close(ctx context.Context) *lease.Stats {
	var st *lease.Stats
	for i, la := range t.leases {
		_ = t.stopLeases[i]()
		s := la.Stats()
		if st == nil {
			st = &lease.Stats{}
		}
		st.Decisions += s.Decisions
		st.Local += s.Local
		st.Leases += s.Leases
		st.Returns += s.Returns
		st.Direct += s.Direct
		st.Failures += s.Failures
	}
	for _, stop := range t.stops {
		stop()
	}
	for _, c := range t.clients {
		_ = c.Close()
	}
	return st
}

// ---- the run ----

type worker struct {
	hist     *hdrhistogram.Histogram
	sent     []int64
	admitted []int64
	sources  map[string]int64
	errors   int64
	lastErr  error
	limit    int64 // the largest "limit" seen in a response
}

func run(ctx context.Context, o options) (*Result, error) {
	var tgt target
	if o.redisAddr != "" {
		t, err := newInprocTarget(ctx, &o)
		if err != nil {
			return nil, err
		}
		tgt = t
	} else {
		tgt = newHTTPTarget(&o)
	}
	var stats *redis.Client
	if o.redisStats != "" {
		stats = redis.NewClient(&redis.Options{Addr: o.redisStats})
		defer stats.Close()
	}
	before, err := scriptCalls(ctx, stats)
	if err != nil {
		return nil, err
	}

	workers := make([]*worker, o.conns)
	for i := range workers {
		workers[i] = &worker{hist: hdrhistogram.New(1, int64(60*time.Second/time.Microsecond), 3),
			sent: make([]int64, o.keys+1), admitted: make([]int64, o.keys+1), sources: map[string]int64{}}
	}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	start := time.Now()

	// Open loop at a fixed rate: a pacer hands out send slots every 200µs
	// (the runtime's timers are that coarse); slots the workers cannot take
	// in time are dropped and counted. Latency is measured from the send,
	// as wrk does, or with -from-schedule from when the slot was due (the
	// open model: it includes the pacer's up to 200µs and any wait for a
	// free worker).
	var ticks chan time.Time
	var pacerDone chan struct{}
	var dropped atomic.Int64
	if o.rate > 0 {
		ticks = make(chan time.Time, 1<<16)
		pacerDone = make(chan struct{})
		go func() {
			defer close(pacerDone)
			defer close(ticks)
			var n int64
			for {
				el := time.Since(start)
				if el >= o.duration {
					return
				}
				due := int64(el.Seconds() * o.rate)
				for ; n < due; n++ {
					select {
					case ticks <- start.Add(time.Duration(float64(n) / o.rate * float64(time.Second))):
					default: // the workers cannot keep up: the rest of this tick is dropped and counted
						dropped.Add(due - n)
						n = due
					}
				}
				select {
				case <-runCtx.Done():
					return
				case <-time.After(200 * time.Microsecond):
				}
			}
		}()
	}

	var wg sync.WaitGroup
	for wi, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := newChooser(&o, uint64(wi)+1)
			for {
				var due time.Time
				if ticks != nil {
					var ok bool
					if due, ok = <-ticks; !ok {
						return
					}
				} else if runCtx.Err() != nil {
					return
				}
				k := next()
				sent := time.Now()
				if o.fromSchedule && !due.IsZero() {
					sent = due
				}
				out, err := tgt.decide(context.Background(), wi, k)
				lat := time.Since(sent)
				if err != nil {
					w.errors++
					w.lastErr = err
					continue
				}
				_ = w.hist.RecordValue(max(1, lat.Microseconds()))
				w.sent[k]++
				if out.allowed {
					w.admitted[k]++
				}
				w.sources[out.source]++
				w.limit = max(w.limit, out.limit)
			}
		}()
	}
	wg.Wait()
	if pacerDone != nil {
		<-pacerDone
	}
	elapsed := time.Since(start)
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Second)
	ls := tgt.close(closeCtx)
	cancelClose()
	after, err := scriptCalls(ctx, stats)
	if err != nil {
		return nil, err
	}
	if o.limitBurst == 0 {
		for _, w := range workers {
			o.limitBurst = max(o.limitBurst, w.limit)
		}
	}
	r := summarize(&o, workers, elapsed, after-before, stats != nil, ls)
	r.Dropped = dropped.Load()
	return r, nil
}

// scriptCalls is how many scripts (EVALSHA + EVAL) Redis has run.
func scriptCalls(ctx context.Context, c *redis.Client) (int64, error) {
	if c == nil {
		return 0, nil
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, p := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(line, p); ok {
				v, _, _ := strings.Cut(rest, ",")
				x, _ := strconv.ParseInt(v, 10, 64)
				n += x
			}
		}
	}
	return n, nil
}

// Result is one run's measurements.
type Result struct {
	Label        string           `json:"label"`
	Mode         string           `json:"mode"`
	Dist         string           `json:"dist"`
	Instances    int              `json:"instances"`
	Lease        bool             `json:"lease"`
	Rate         float64          `json:"targetRate"`
	Seconds      float64          `json:"seconds"`
	Requests     int64            `json:"requests"`
	PerSecond    float64          `json:"perSecond"`
	Errors       int64            `json:"errors"`
	Dropped      int64            `json:"dropped"` // fixed rate: sends the workers could not start in time
	LastError    string           `json:"lastError,omitempty"`
	Allowed      int64            `json:"allowed"`
	BySource     map[string]int64 `json:"bySource"`
	LatencyUS    map[string]int64 `json:"latencyMicros"`
	RedisScripts int64            `json:"redisScripts"`
	RedisPerSec  float64          `json:"redisScriptsPerSecond"`
	TripsPerDec  float64          `json:"redisRoundTripsPerDecision"`
	Lease_       *lease.Stats     `json:"leaseStats,omitempty"`
	Keys         []KeyResult      `json:"topKeys"`
	statsKnown   bool
}

// KeyResult is what one key got against its limit.
type KeyResult struct {
	Key      string  `json:"key"`
	Sent     int64   `json:"sent"`
	Admitted int64   `json:"admitted"`
	Cap      float64 `json:"cap"`   // burst + rate × seconds (0 when the rate is unknown)
	Ratio    float64 `json:"ratio"` // admitted ÷ cap
}

func summarize(o *options, ws []*worker, elapsed time.Duration, scripts int64, statsKnown bool, ls *lease.Stats) *Result {
	h := hdrhistogram.New(1, int64(60*time.Second/time.Microsecond), 3)
	sent := make([]int64, o.keys+1)
	admitted := make([]int64, o.keys+1)
	r := &Result{Label: o.label, Dist: o.dist, Instances: o.instances, Lease: o.lease, Rate: o.rate,
		Seconds: elapsed.Seconds(), BySource: map[string]int64{}, Lease_: ls, statsKnown: statsKnown}
	r.Mode = "http"
	if o.redisAddr != "" {
		r.Mode = "in-process"
	} else {
		r.Instances = len(o.urls)
	}
	var lastErr error
	for _, w := range ws {
		h.Merge(w.hist)
		r.Errors += w.errors
		if w.lastErr != nil {
			lastErr = w.lastErr
		}
		for k := range sent {
			sent[k] += w.sent[k]
			admitted[k] += w.admitted[k]
		}
		for s, n := range w.sources {
			r.BySource[s] += n
		}
	}
	if lastErr != nil {
		r.LastError = lastErr.Error()
	}
	r.Requests = h.TotalCount()
	r.PerSecond = float64(r.Requests) / r.Seconds
	for k := range admitted {
		r.Allowed += admitted[k]
	}
	r.LatencyUS = map[string]int64{"p50": h.ValueAtQuantile(50), "p90": h.ValueAtQuantile(90),
		"p99": h.ValueAtQuantile(99), "p99.9": h.ValueAtQuantile(99.9), "max": h.Max()}
	r.RedisScripts = scripts
	r.RedisPerSec = float64(scripts) / r.Seconds
	if r.Requests > 0 {
		r.TripsPerDec = float64(scripts) / float64(r.Requests)
	}
	idx := make([]int, 0, len(sent))
	for k := range sent {
		if sent[k] > 0 {
			idx = append(idx, k)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return int(sent[b] - sent[a]) })
	for _, k := range idx[:min(5, len(idx))] {
		kr := KeyResult{Key: keyName(o, k), Sent: sent[k], Admitted: admitted[k]}
		if o.limitRate > 0 && o.limitBurst > 0 {
			kr.Cap = float64(o.limitBurst) + o.limitRate*r.Seconds
			kr.Ratio = float64(kr.Admitted) / kr.Cap
		}
		r.Keys = append(r.Keys, kr)
	}
	return r
}

// Text is the human-readable report.
func (r *Result) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s dist=%s instances=%d lease=%v rate=%v: %d decisions in %.1fs = %.0f/s, errors %d\n",
		r.Label, r.Mode, r.Dist, r.Instances, r.Lease, r.Rate, r.Requests, r.Seconds, r.PerSecond, r.Errors)
	if r.Dropped > 0 {
		fmt.Fprintf(&b, "  dropped (could not be sent at the fixed rate): %d\n", r.Dropped)
	}
	if r.LastError != "" {
		fmt.Fprintf(&b, "  last error: %s\n", r.LastError)
	}
	fmt.Fprintf(&b, "  latency µs: p50 %d p90 %d p99 %d p99.9 %d max %d\n",
		r.LatencyUS["p50"], r.LatencyUS["p90"], r.LatencyUS["p99"], r.LatencyUS["p99.9"], r.LatencyUS["max"])
	fmt.Fprintf(&b, "  allowed %d; by source %v\n", r.Allowed, r.BySource)
	if r.statsKnown {
		fmt.Fprintf(&b, "  redis scripts %d = %.0f/s, %.4f round trips per decision\n", r.RedisScripts, r.RedisPerSec, r.TripsPerDec)
	}
	if r.Lease_ != nil {
		fmt.Fprintf(&b, "  lease stats %+v\n", *r.Lease_)
	}
	var hotShare float64
	if len(r.Keys) > 0 && r.Requests > 0 {
		hotShare = float64(r.Keys[0].Sent) / float64(r.Requests)
	}
	// One machine-readable line (bench/run.sh reads it).
	fmt.Fprintf(&b, "  summary rps=%.0f p50=%d p99=%d scripts_per_s=%.0f trips=%.4f hot_share=%.3f allowed=%d p999=%d errors=%d dropped=%d\n",
		r.PerSecond, r.LatencyUS["p50"], r.LatencyUS["p99"], r.RedisPerSec, r.TripsPerDec, hotShare, r.Allowed, r.LatencyUS["p99.9"], r.Errors, r.Dropped)
	for _, k := range r.Keys {
		if k.Cap > 0 {
			fmt.Fprintf(&b, "  key %s: sent %d admitted %d cap %.0f ratio %.4f\n", k.Key, k.Sent, k.Admitted, k.Cap, k.Ratio)
		} else {
			fmt.Fprintf(&b, "  key %s: sent %d admitted %d\n", k.Key, k.Sent, k.Admitted)
		}
	}
	return b.String()
}
