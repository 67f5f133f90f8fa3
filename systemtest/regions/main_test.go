package regions

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// The demo tier of make regions-up: 100/s, burst 100, one limit shared by
// every region; and the same numbers regional, for contrast. world and
// here are TestUsageAcrossRegionsIsExact's (usage_test.go).
const (
	rate  = 100.0
	burst = 100.0
)

const policy = `version: 1
default_tier: local
tiers:
  global: { rate: 100, burst: 100, scope: global }
  local:  { rate: 100, burst: 100 }
  world:  { rate: 1, burst: 20, scope: global }
  here:   { rate: 1, burst: 10 }
keys:
  g: global
  l: local
  acct_world: world
  acct_here: here
`

// startBed starts regions a, b, c (home a) with the demo policy.
func startBed(t *testing.T) *testenv.Regions {
	t.Helper()
	return testenv.StartRegions(t, testenv.RegionsConfig{LimiterBin: testenv.Binary(t, "cmd/limiter"), Policy: policy})
}

// tally counts one stream of decisions.
type tally struct {
	mu       sync.Mutex
	sent     int
	admitted int
	errs     int
	lastErr  error
	bySource map[string]int // admitted and rejected, by source
	admitBy  map[string]int // admitted, by source
	first    time.Time
	last     time.Time
	admits   []time.Time // when each admitted answer came
}

func (t *tally) add(at time.Time, d testenv.Decision, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bySource == nil {
		t.bySource, t.admitBy = map[string]int{}, map[string]int{}
	}
	t.sent++
	if err != nil {
		t.errs++
		t.lastErr = err
		return
	}
	t.bySource[d.Source]++
	if d.Allowed {
		t.admitted++
		t.admitBy[d.Source]++
		t.admits = append(t.admits, at)
	}
}

// admittedBetween counts the admitted answers that came in [from, to).
func (t *tally) admittedBetween(from, to time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, a := range t.admits {
		if !a.Before(from) && a.Before(to) {
			n++
		}
	}
	return n
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var src []string
	for s, n := range t.bySource {
		src = append(src, fmt.Sprintf("%s=%d(admitted %d)", s, n, t.admitBy[s]))
	}
	sort.Strings(src)
	s := fmt.Sprintf("sent %d, admitted %d, errors %d, by source [%s]", t.sent, t.admitted, t.errs, strings.Join(src, " "))
	if t.lastErr != nil {
		s += fmt.Sprintf(" (last error: %v)", t.lastErr)
	}
	return s
}

// drive sends /check for key to region r at about perSecond until stop is
// closed, from a few workers (a worker busy longer than the interval
// skips arrivals: a slow machine sends less, never in bursts).
func drive(r *testenv.Region, key string, perSecond float64, stop <-chan struct{}, t *tally) *sync.WaitGroup {
	var wg sync.WaitGroup
	ticks := make(chan struct{})
	wg.Go(func() {
		defer close(ticks)
		tk := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				select {
				case ticks <- struct{}{}:
				default: // every worker busy: this arrival is skipped
				}
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for range ticks {
				d, err := r.Check(key, "api", 1)
				t.add(time.Now(), d, err)
			}
		})
	}
	return &wg
}

// run drives every region of demand for d and returns each one's tally
// and how long it took from the first send to the last answer.
func run(demand map[*testenv.Region]float64, key string, d time.Duration) (map[*testenv.Region]*tally, time.Duration) {
	stop := make(chan struct{})
	out := map[*testenv.Region]*tally{}
	var wgs []*sync.WaitGroup
	start := time.Now()
	for r, perSecond := range demand {
		out[r] = &tally{}
		wgs = append(wgs, drive(r, key, perSecond, stop, out[r]))
	}
	time.Sleep(d)
	close(stop)
	for _, wg := range wgs {
		wg.Wait()
	}
	return out, time.Since(start)
}

// regionBlock is /readyz's "region" object and the HTTP status (nil and
// 0, the test failed, when /readyz does not answer). It may be called
// from any goroutine of the test.
func regionBlock(t *testing.T, r *testenv.Region) (map[string]any, int) {
	t.Helper()
	body, status, err := r.Limiter().Readyz()
	if err != nil {
		t.Errorf("region %s: %v", r.Name, err)
		return nil, 0
	}
	block, _ := body["region"].(map[string]any)
	return block, status
}

// waitFor polls cond every 100 ms until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(testenv.Timeout(within))
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
