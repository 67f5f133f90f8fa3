// Package h2grpc is a lean load generator for one unary gRPC method: it
// speaks HTTP/2 itself (golang.org/x/net/http2's Framer and hpack) and
// sends request bodies framed once at start, as Envoy's C++ client sends
// many concurrent streams over a few connections. grpc-go's client
// marshals, allocates and schedules goroutines per call, which on a
// 2-core machine shared with the server under test costs more CPU than
// the server spends (ghz: ~144 µs per call): the figure then measures the
// client. Here a call is a HEADERS and a DATA frame written from the
// connection's reader goroutine when the previous call on it ends.
//
// It honours HTTP/2 flow control both ways (WINDOW_UPDATEs for what it
// receives; the server's connection and stream windows for what it sends),
// the server's SETTINGS (acknowledged; MAX_CONCURRENT_STREAMS, window and
// frame sizes, header table size) and PINGs, and reads every answer:
// :status, grpc-status in the trailers, and the response message, which a
// caller-supplied Classify sorts into outcomes. Anything else (a non-zero
// grpc-status, RST_STREAM, GOAWAY, a lost connection, a malformed answer,
// a call still unanswered after the grace period) is an error, counted by
// kind.
package h2grpc

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/ratewarden/ratewarden/testkit/proccpu"
)

// Config says what to send, how, and for how long.
type Config struct {
	Addr   string   // host:port, plain-text HTTP/2 (h2c with prior knowledge, as gRPC without TLS)
	Path   string   // the method, e.g. /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
	Bodies [][]byte // gRPC-framed request messages, sent round robin
	// Headers are extra request headers (lower-case names), e.g.
	// authorization.
	Headers [][2]string

	Conns   int // HTTP/2 connections
	Streams int // calls in flight in total, spread over Conns (fewer if the server allows fewer)

	Duration time.Duration // how long to start calls
	Calls    int64         // stop after starting this many calls (0: no limit)
	Rate     float64       // calls per second in total (open model); 0 = closed loop, flat out
	// Grace is how long calls in flight at the end may take to finish
	// (default 10 s); what is still unanswered then is an error.
	Grace time.Duration

	// Classify sorts an answered call (grpc-status 0) by its response
	// message (without the 5-byte header) into Outcomes[i]; an error
	// counts as a malformed answer.
	Classify func(msg []byte) (int, error)
	Outcomes []string
}

// Result is what a run answered.
type Result struct {
	Calls    int64            // calls that ended (outcomes + errors)
	Outcomes map[string]int64 // answered calls by outcome
	Errors   map[string]int64 // failed calls by kind
	Samples  map[string]string
	// Dropped: open model, calls that were due while every stream was
	// busy (the server is slower than the rate): not sent, not in Calls.
	Dropped int64
	Elapsed time.Duration // from the first call to the last answer
	CPU     time.Duration // this process's user + system CPU over the run
	Latency *hdrhistogram.Histogram
}

// ErrorCount is the number of failed calls.
func (r *Result) ErrorCount() int64 {
	var n int64
	for _, v := range r.Errors {
		n += v
	}
	return n
}

// Text is a human-readable report whose "summary" line has key=value
// fields for scripts.
func (r *Result) Text() string {
	var b strings.Builder
	secs := r.Elapsed.Seconds()
	q := func(p float64) int64 { return r.Latency.ValueAtQuantile(p) }
	fmt.Fprintf(&b, "  summary calls=%d rps=%.0f", r.Calls, float64(r.Calls)/secs)
	names := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, " %s=%d", k, r.Outcomes[k])
	}
	cpu := 0.0
	if r.Calls > 0 {
		cpu = float64(r.CPU.Microseconds()) / float64(r.Calls)
	}
	fmt.Fprintf(&b, " errors=%d dropped=%d p50=%d p90=%d p99=%d p999=%d max=%d cpu_us_per_call=%.1f elapsed=%.2f\n",
		r.ErrorCount(), r.Dropped, q(50), q(90), q(99), q(99.9), r.Latency.Max(), cpu, secs)
	b.WriteString("  (latencies in µs; an open-model call's latency counts from when it was due)\n")
	kinds := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "  error %q: %d (e.g. %s)\n", k, r.Errors[k], r.Samples[k])
	}
	return b.String()
}

// Timeout is the grpc-timeout request header for d (whole milliseconds,
// at least one), which Envoy's rate limit filter sends on every call (its
// timeout, 20 ms by default): a server then runs each call under a
// deadline, which costs it a timer.
func Timeout(d time.Duration) [2]string {
	ms := max(1, (d+time.Millisecond-1)/time.Millisecond)
	if ms > 99999999 { // eight digits at most
		return [2]string{"grpc-timeout", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) + "S"}
	}
	return [2]string{"grpc-timeout", strconv.FormatInt(int64(ms), 10) + "m"}
}

func (c *Config) validate() error {
	switch {
	case c.Addr == "" || !strings.HasPrefix(c.Path, "/"):
		return errors.New("h2grpc: Addr and an absolute Path are required")
	case len(c.Bodies) == 0:
		return errors.New("h2grpc: no request bodies")
	case c.Conns < 1 || c.Streams < c.Conns:
		return fmt.Errorf("h2grpc: need at least one stream per connection (Conns %d, Streams %d)", c.Conns, c.Streams)
	case c.Duration <= 0 && c.Calls <= 0:
		return errors.New("h2grpc: Duration or Calls must be positive")
	case c.Rate < 0:
		return errors.New("h2grpc: Rate must be ≥ 0")
	case c.Classify == nil || len(c.Outcomes) == 0:
		return errors.New("h2grpc: Classify and Outcomes are required")
	}
	return nil
}

// Run drives the load until Duration has passed (or Calls were started,
// or ctx ends), waits up to Grace for the calls in flight, and reports.
// It fails only when no connection could be set up.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	shared := &shared{cfg: &cfg}
	if cfg.Calls > 0 {
		shared.budget.Store(cfg.Calls)
	} else {
		shared.budget.Store(-1)
	}
	conns := make([]*conn, cfg.Conns)
	for i := range conns {
		streams := cfg.Streams / cfg.Conns
		if i < cfg.Streams%cfg.Conns {
			streams++
		}
		c, err := dial(ctx, shared, streams)
		if err != nil {
			for _, c := range conns[:i] {
				c.nc.Close()
			}
			return nil, err
		}
		conns[i] = c
	}
	cpu0 := proccpu.Self()
	start := time.Now()
	end := start.Add(cfg.Duration)
	if cfg.Duration <= 0 {
		end = start.Add(100 * 365 * 24 * time.Hour) // Calls bounds the run
	}
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() { defer wg.Done(); c.readLoop() }()
		if cfg.Rate > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.schedule(runCtx, start, end, time.Duration(float64(time.Second)*float64(cfg.Conns)/cfg.Rate))
				c.stop()
			}()
		} else {
			c.mu.Lock()
			c.fill()
			c.flush()
			c.mu.Unlock()
			go func() { <-runCtx.Done(); c.stop() }()
		}
	}
	// The grace period: calls unanswered by then are cut (and counted).
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-runCtx.Done():
		t := time.NewTimer(cfg.Grace)
		select {
		case <-stopped:
		case <-t.C:
			for _, c := range conns {
				c.cut(fmt.Sprintf("unanswered %s after the end of the run", cfg.Grace))
			}
			<-stopped
		}
		t.Stop()
	}
	res := &Result{
		Outcomes: map[string]int64{},
		Errors:   map[string]int64{},
		Samples:  map[string]string{},
		Elapsed:  time.Since(start),
		CPU:      proccpu.Self() - cpu0,
		Latency:  newHist(),
	}
	for _, name := range cfg.Outcomes {
		res.Outcomes[name] = 0
	}
	for _, c := range conns {
		c.nc.Close()
		for i, n := range c.outcomes {
			res.Outcomes[cfg.Outcomes[i]] += n
			res.Calls += n
		}
		for k, n := range c.errors {
			res.Errors[k] += n
			res.Calls += n
			if _, ok := res.Samples[k]; !ok {
				res.Samples[k] = c.samples[k]
			}
		}
		res.Dropped += c.dropped
		res.Latency.Merge(c.hist)
	}
	return res, nil
}

// shared is what the connections of one run share.
type shared struct {
	cfg    *Config
	next   atomic.Uint64 // round robin over Bodies
	budget atomic.Int64  // calls left to start; -1 = no limit
}

// take reserves one call of the budget.
func (s *shared) take() bool {
	for {
		b := s.budget.Load()
		if b < 0 {
			return true
		}
		if b == 0 {
			return false
		}
		if s.budget.CompareAndSwap(b, b-1) {
			return true
		}
	}
}

// giveBack returns a reserved call that was not started.
func (s *shared) giveBack() {
	if s.budget.Load() >= 0 {
		s.budget.Add(1)
	}
}

func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(60*time.Second/time.Microsecond), 3)
}
