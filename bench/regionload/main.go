// Command regionload measures global limits across regions (issue 37's
// targets) on the multi-region test bed: it starts regions a, b, c
// (testkit/testenv.NewRegions: per region a redis-server and a limiter,
// the WAN between them through wanproxy links of 15, 40 and 75 ms one-way
// with 10% jitter, home a), drives /check traffic at each region's limiter
// from this one process (one clock for every arrival), and prints each
// target figure beside its goal.
//
// Ground truth: every arrival of a phase (its send time and cost),
// replayed through one ideal token bucket with no latency, starting full
// at the phase's first arrival. Each phase uses a fresh key (the policy's
// default tier is global), so every phase starts from a full global
// bucket as the ideal one does.
//
//	regionload -limiter bin/limiter -phase 15s -cut 60s
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func main() {
	bin := flag.String("limiter", "bin/limiter", "the limiter binary")
	phase := flag.Duration("phase", 15*time.Second, "each measuring phase")
	cutFor := flag.Duration("cut", 60*time.Second, "how long region b is cut off")
	rate := flag.Float64("rate", 1000, "the global limit's rate, tokens/s")
	burst := flag.Float64("burst", 1000, "its burst, tokens")
	cost := flag.Int("cost", 10, "tokens per request (requests/s = tokens/s ÷ cost)")
	jump := flag.Duration("jump", 5*time.Second, "how often all traffic jumps region in the jumping phase")
	storeTimeout := flag.String("store-timeout", "", "LIMITER_STORE_TIMEOUT of the limiters (empty: theirs)")
	only := flag.String("only", "", "comma-separated phases to run (latency,spread,jump,demand3x,shift,cut); empty: all")
	flag.Parse()

	dir, err := os.MkdirTemp("", "regionload-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	policy := fmt.Sprintf(`version: 1
default_tier: global
tiers:
  global: { rate: %g, burst: %g, scope: global }
  local:  { rate: %g, burst: %g }
keys:
  regional-key: local
`, *rate, *burst, *rate*10, *burst*10)
	cfg := testenv.RegionsConfig{LimiterBin: *bin, Policy: policy}
	if *storeTimeout != "" {
		cfg.Env = func(string) []string { return []string{"LIMITER_STORE_TIMEOUT=" + *storeTimeout} }
	}
	bed, err := testenv.NewRegions(dir, cfg)
	if err != nil {
		fail(err)
	}
	defer bed.Close()
	m := &meter{bed: bed, rate: *rate, burst: *burst, cost: *cost}
	want := func(p string) bool { return *only == "" || slices.Contains(strings.Split(*only, ","), p) }
	fmt.Printf("# regions a, b, c (home a), one-way 15/40/75 ms, 10%% jitter; global limit %g tokens/s, burst %g, %d tokens a request\n", *rate, *burst, *cost)
	fmt.Printf("# load before: %s\n", loadavg())
	var rows []row
	if want("latency") {
		rows = append(rows, m.latency(*phase))
	}
	if want("spread") {
		rows = append(rows, m.spread("spread", 1.5, *phase, 0))
	}
	if want("jump") {
		rows = append(rows, m.spread("jump", 1.5, max(*phase, 4**jump), *jump))
	}
	if want("demand3x") {
		rows = append(rows, m.spread("demand3x", 3, *phase, 0))
	}
	if want("shift") {
		rows = append(rows, m.shift(*phase))
	}
	if want("cut") {
		rows = append(rows, m.cut(*cutFor)...)
	}
	fmt.Printf("# load after: %s\n\n", loadavg())
	fmt.Println("| figure | value | goal | measured |")
	fmt.Println("|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s | %s |\n", r.figure, r.value, r.goal, r.detail)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "regionload:", err)
	os.Exit(1)
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type row struct{ figure, value, goal, detail string }

// meter drives the bed.
type meter struct {
	bed         *testenv.Regions
	rate, burst float64
	cost        int
	keyN        int
}

// freshKey is a key no phase used yet: its global bucket is full.
func (m *meter) freshKey(phase string) string {
	m.keyN++
	return fmt.Sprintf("%s-%d-%d", phase, m.keyN, time.Now().UnixNano())
}

// sample is one request's fate.
type sample struct {
	region  string
	key     string
	sent    time.Time
	latency time.Duration
	allowed bool
	source  string
	err     bool
}

// recorder collects samples from every sender.
type recorder struct {
	mu      sync.Mutex
	samples []sample
	skipped int // arrivals not sent: every worker of the region busy
	cost    int // tokens a request when not the meter's (0: the meter's)
}

func (r *recorder) add(s sample) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}}

// send posts one /check and records it.
func (m *meter) send(rec *recorder, region, key string) {
	l := m.bed.Region(region).Limiter()
	cost := m.cost
	if rec.cost > 0 {
		cost = rec.cost
	}
	body := []byte(fmt.Sprintf(`{"key":%q,"scope":"api","cost":%d}`, key, cost))
	start := time.Now()
	resp, err := client.Post(l.URL+"/check", "application/json", bytes.NewReader(body))
	s := sample{region: region, key: key, sent: start}
	if err != nil {
		s.err = true
		rec.add(s)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s.latency = time.Since(start)
	var d struct {
		Allowed bool   `json:"allowed"`
		Source  string `json:"source"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &d) != nil {
		s.err = true
	}
	s.allowed, s.source = d.Allowed, d.Source
	rec.add(s)
}

// drive sends to region at perSecond requests/s for key() until stop,
// paced (open loop) from 16 workers; an arrival that finds every worker
// busy is skipped and counted.
func (m *meter) drive(rec *recorder, region string, perSecond func() float64, key func() string, stop <-chan struct{}, wg *sync.WaitGroup) {
	work := make(chan string)
	wg.Go(func() {
		defer close(work)
		next := time.Now()
		for {
			ps := perSecond()
			if ps <= 0 {
				// No demand here now: look again in 10 ms, and start the
				// schedule afresh when it comes.
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				next = time.Now()
				continue
			}
			iv := time.Duration(float64(time.Second) / ps)
			next = next.Add(iv)
			if d := time.Until(next); d > 0 {
				select {
				case <-stop:
					return
				case <-time.After(d):
				}
			} else if d < -100*time.Millisecond {
				next = time.Now() // fell behind: do not burst to catch up
			}
			select {
			case <-stop:
				return
			default:
			}
			select {
			case work <- key():
			default:
				rec.mu.Lock()
				rec.skipped++
				rec.mu.Unlock()
			}
		}
	})
	for range 16 {
		wg.Go(func() {
			for k := range work {
				m.send(rec, region, k)
			}
		})
	}
}

// ideal replays samples through one token bucket with no latency and
// returns how many it admits.
func (m *meter) ideal(samples []sample) int {
	s := slices.Clone(samples)
	sort.Slice(s, func(i, j int) bool { return s[i].sent.Before(s[j].sent) })
	if len(s) == 0 {
		return 0
	}
	tokens, last, n := m.burst, s[0].sent, 0
	for _, x := range s {
		tokens = math.Min(m.burst, tokens+m.rate*x.sent.Sub(last).Seconds())
		last = x.sent
		if tokens >= float64(m.cost) {
			tokens -= float64(m.cost)
			n++
		}
	}
	return n
}

func count(samples []sample, keep func(sample) bool) int {
	n := 0
	for _, s := range samples {
		if keep(s) {
			n++
		}
	}
	return n
}

// latency: decisions of a global key and of a regional key in region b,
// interleaved, both under their limits; the ratio of their p99s.
func (m *meter) latency(d time.Duration) row {
	// One token a request: many decisions under the limit, so that a
	// p99 rests on more than a handful of samples.
	rec := &recorder{cost: 1}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	g := m.freshKey("latency")
	perSecond := min(0.4*m.rate, 150) // under the limit
	m.drive(rec, "b", func() float64 { return perSecond }, func() string { return g }, stop, &wg)
	m.drive(rec, "b", func() float64 { return perSecond }, func() string { return "regional-key" }, stop, &wg)
	time.Sleep(d)
	close(stop)
	wg.Wait()
	hg, hr := hdrhistogram.New(1, 10_000_000, 3), hdrhistogram.New(1, 10_000_000, 3)
	errs, regional := 0, 0
	for _, s := range rec.samples {
		switch {
		case s.err:
			errs++
		case s.key == g:
			hg.RecordValue(s.latency.Microseconds())
			if s.source == "regional" {
				regional++
			}
		default:
			hr.RecordValue(s.latency.Microseconds())
		}
	}
	pg, pr := hg.ValueAtQuantile(99), hr.ValueAtQuantile(99)
	return row{
		figure: "decision p99, global key ÷ regional key (region b, same run)",
		value:  fmt.Sprintf("%.2f", float64(pg)/float64(max(pr, 1))),
		goal:   "≤ 1.05",
		detail: fmt.Sprintf("p99 %d µs ÷ %d µs (p50 %d ÷ %d µs), %d + %d decisions at %.0f/s each, %d errors, %d on escrow, %s",
			pg, pr, hg.ValueAtQuantile(50), hr.ValueAtQuantile(50), hg.TotalCount(), hr.TotalCount(), perSecond, errs, regional, fmtDur(d)),
	}
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.0f s", d.Seconds()) }

// spread: demand × the limit, split evenly over the three regions; with
// every > 0, all of it in one region at a time, jumping to the next
// region every that often. admitted ÷ the ideal bucket's.
func (m *meter) spread(name string, demand float64, d, every time.Duration) row {
	rec := &recorder{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	key := m.freshKey(name)
	total := demand * m.rate / float64(m.cost)
	start := time.Now()
	names := m.bed.Names()
	for i, r := range names {
		per := func() float64 {
			if every == 0 {
				return total / float64(len(names))
			}
			if int(time.Since(start)/every)%len(names) == i {
				return total
			}
			return 0
		}
		m.drive(rec, r, per, func() string { return key }, stop, &wg)
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	admitted := count(rec.samples, func(s sample) bool { return s.allowed })
	errs := count(rec.samples, func(s sample) bool { return s.err })
	degraded := count(rec.samples, func(s sample) bool { return s.source == "degraded" })
	ideal := m.ideal(rec.samples)
	ratio := float64(admitted) / float64(max(ideal, 1))
	detail := fmt.Sprintf("admitted %d, ideal bucket %d, of %d sent (%d skipped by the load tool, %d errors, %d degraded), demand %.1f× the limit, %s",
		admitted, ideal, len(rec.samples), rec.skipped, errs, degraded, demand, fmtDur(d))
	switch {
	case name == "demand3x":
		return row{figure: "utilisation, demand 3× the limit over 3 regions (admitted ÷ ideal)", value: fmt.Sprintf("%.3f", ratio), goal: "≥ 0.97", detail: detail}
	case every > 0:
		return row{figure: fmt.Sprintf("admitted ÷ ideal bucket, all traffic jumping region every %s", every), value: fmt.Sprintf("%.3f", ratio), goal: "≤ 1.02", detail: detail}
	}
	return row{figure: "admitted ÷ ideal bucket, traffic spread over 3 regions", value: fmt.Sprintf("%.3f", ratio), goal: "≤ 1.02", detail: detail}
}

// shift: 1.5× the limit in region b for d/2, then all of it in region c:
// the time from the move until c is admitted at 90% of the limit's rate
// (over a sliding 500 ms).
func (m *meter) shift(d time.Duration) row {
	rec := &recorder{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	key := m.freshKey("shift")
	total := 1.5 * m.rate / float64(m.cost)
	start := time.Now()
	half := d / 2
	m.drive(rec, "b", func() float64 {
		if time.Since(start) < half {
			return total
		}
		return 0
	}, func() string { return key }, stop, &wg)
	m.drive(rec, "c", func() float64 {
		if time.Since(start) >= half {
			return total
		}
		return 0
	}, func() string { return key }, stop, &wg)
	time.Sleep(d)
	close(stop)
	wg.Wait()
	moved := start.Add(half)
	var admits []time.Time
	for _, s := range rec.samples {
		if s.region == "c" && s.allowed {
			admits = append(admits, s.sent.Add(s.latency))
		}
	}
	slices.SortFunc(admits, func(a, b time.Time) int { return a.Compare(b) })
	const win = 500 * time.Millisecond
	need := int(0.9 * m.rate / float64(m.cost) * win.Seconds())
	follow := time.Duration(-1)
	for i := range admits {
		j := i + need - 1
		if j < len(admits) && admits[j].Sub(admits[i]) <= win {
			follow = admits[i].Sub(moved)
			break
		}
	}
	value := "never"
	if follow >= 0 {
		value = fmt.Sprintf("%.2f s", follow.Seconds())
	}
	return row{
		figure: "time for the budget to follow a demand shift (b → c)",
		value:  value, goal: "≤ 1 s",
		detail: fmt.Sprintf("from the move until region c is admitted at ≥ 90%% of the limit over %s; demand 1.5× the limit, %d admitted in c after the move, %s per phase", win, len(admits), fmtDur(half)),
	}
}

// cut: every region at 1× ÷ 3 of the limit... region b cut off for d: what
// all regions admitted over the ideal bucket during the cut, beside b's
// escrow share (burst/N + rate/N × d), and the other regions' degraded
// decisions.
func (m *meter) cut(d time.Duration) []row {
	rec := &recorder{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	key := m.freshKey("cut")
	names := m.bed.Names()
	per := m.rate / float64(m.cost) // each region at the whole limit: 3× in all
	for _, r := range names {
		m.drive(rec, r, func() float64 { return per }, func() string { return key }, stop, &wg)
	}
	time.Sleep(3 * time.Second) // warm: the pools fill
	m.bed.Cut("b")
	cutAt := time.Now()
	time.Sleep(d)
	healAt := time.Now()
	m.bed.Heal("b")
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	var during []sample
	for _, s := range rec.samples {
		if !s.sent.Before(cutAt) && s.sent.Before(healAt) {
			during = append(during, s)
		}
	}
	cutD := healAt.Sub(cutAt)
	admitted := count(during, func(s sample) bool { return s.allowed })
	ideal := m.ideal(during)
	n := float64(len(names))
	share := m.burst/n + m.rate/n*cutD.Seconds()
	over := float64((admitted - ideal) * m.cost)
	escrowB := count(during, func(s sample) bool { return s.region == "b" && s.source == "regional" && s.allowed })
	othersDegraded := count(during, func(s sample) bool { return s.region != "b" && (s.source == "degraded" || s.err) })
	othersTotal := count(during, func(s sample) bool { return s.region != "b" })
	bRegional := count(during, func(s sample) bool { return s.region == "b" && s.source == "regional" })
	// The ideal bucket of the cut window starts full, as the global bucket
	// does not (the warm-up spent it): admitted over the ideal is a lower
	// estimate of the excess; admitted over rate × d is the other reading.
	overRate := float64(admitted*m.cost) - m.rate*cutD.Seconds()
	return []row{
		{
			figure: fmt.Sprintf("region b cut off for %s: admitted over the limit ÷ b's escrow share", fmtDur(cutD)),
			value:  fmt.Sprintf("%.2f", math.Max(over, overRate)/share),
			goal:   "≤ 1",
			detail: fmt.Sprintf("all regions admitted %d tokens, ideal bucket %d, rate × d %.0f; over: %.0f (ideal) / %.0f (rate × d) tokens; escrow share burst/N + rate/N × d = %.0f; b: %d decisions on escrow, %d admitted",
				admitted*m.cost, ideal*m.cost, m.rate*cutD.Seconds(), over, overRate, share, bRegional, escrowB),
		},
		{
			figure: "other regions' decisions degraded while b is cut off",
			value:  fmt.Sprintf("%d", othersDegraded),
			goal:   "0",
			detail: fmt.Sprintf("of %d decisions in a and c during the cut (degraded or failed)", othersTotal),
		},
	}
}
