// Command slotbench measures concurrency slots (docs/concurrency.md)
// against running limiters, in two parts:
//
//   - rate: POST /check on a concurrency limit followed by POST /release
//     (a slot taken and given back: two calls) beside plain POST /check on a
//     rate limit, closed loop, -conns workers, -keys keys uniformly, the
//     two phases interleaved -passes times; it prints pairs per second ÷
//     checks per second (goal ≥ 0.45);
//
//   - flight: -workers callers spread over every -url take slots of -keys
//     keys (each worker one key; policy: tier flight, concurrency -n) with
//     priority default, hold each for up to
//     -hold, and give it back; one in -leak of them "dies" holding it (never
//     releases: the slot must come back at its lease's end). Each caller
//     counts itself in flight on its key between the allowed answer and its
//     release, so the peak it sees is the callers' own view (the highest of
//     any key's is printed); a limiter that stops
//     answering (killed by the script) is skipped. It runs for -duration,
//     or until -slots slots were taken when that comes first, and prints
//     the peak ÷ n (goal ≤ 1.00), the slots taken and the leaks.
//
//     slotbench -url http://127.0.0.1:8080 -part rate -conns 32 -duration 5s -passes 3
//     slotbench -url http://a,http://b -part flight -n 8 -workers 64 -duration 60s
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	urls := flag.String("url", "http://127.0.0.1:8080", "the limiters' base URLs, comma-separated")
	part := flag.String("part", "rate", "rate or flight")
	conns := flag.Int("conns", 32, "rate: concurrent workers")
	keys := flag.Int("keys", 10000, "rate: keys, uniformly")
	passes := flag.Int("passes", 3, "rate: interleaved passes")
	dur := flag.Duration("duration", 5*time.Second, "each rate phase, or the flight part")
	n := flag.Int64("n", 8, "flight: the key's concurrency limit")
	workers := flag.Int("workers", 64, "flight: callers")
	hold := flag.Duration("hold", 2*time.Millisecond, "flight: longest hold of a slot")
	leak := flag.Int("leak", 500, "flight: one slot in this many is never released")
	upTo := flag.Int64("slots", 0, "flight: stop once this many slots were taken (0: run for -duration)")
	flightKeys := flag.Int("keys-flight", 1, "flight: keys, each with its own share of the callers")
	flag.Parse()
	bases := strings.Split(*urls, ",")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(*conns, *workers)}, Timeout: 5 * time.Second}
	switch *part {
	case "rate":
		rate(client, bases[0], *conns, *keys, *passes, *dur)
	case "flight":
		flight(client, bases, *n, *workers, *flightKeys, *hold, *leak, *upTo, *dur)
	default:
		fmt.Fprintln(os.Stderr, "slotbench: -part is rate or flight")
		os.Exit(2)
	}
}

func post(client *http.Client, url string, b []byte) (int, []byte, error) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

type answer struct {
	Source  string `json:"source"`
	Allowed bool   `json:"allowed"`
	Lease   string `json:"lease"`
	Reason  string `json:"reason"`
}

func rate(client *http.Client, base string, conns, keys, passes int, d time.Duration) {
	res := map[string][]float64{}
	phases := []string{"check", "slot"}
	for pass := range passes {
		for i := range phases {
			phase := phases[(pass+i)%len(phases)]
			rps := ratePhase(client, base, phase, conns, keys, d)
			res[phase] = append(res[phase], rps)
			unit := "checks/s"
			if phase == "slot" {
				unit = "slots taken and given back/s"
			}
			fmt.Printf("pass %d %-6s %10.0f %s\n", pass+1, phase, rps, unit)
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
	}
	r := make([]float64, passes)
	for i := range r {
		r[i] = res["slot"][i] / res["check"][i]
	}
	fmt.Printf("slot (two calls) ÷ check per pass %.2f; median %.2f (goal ≥ 0.45)\n", r, med(r))
}

func ratePhase(client *http.Client, base, phase string, conns, keys int, d time.Duration) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := "k" + strconv.Itoa((w*7919+i*104729)%keys)
				if phase == "check" {
					if st, out, err := post(client, base+"/check", []byte(`{"key":"`+key+`","scope":"tokens","cost":1}`)); err != nil || st != 200 {
						fail("check", st, out, err)
					}
					done.Add(1)
					continue
				}
				st, out, err := post(client, base+"/check", []byte(`{"key":"`+key+`","scope":"slots","tier":"slots"}`))
				var a answer
				if err != nil || st != 200 || json.Unmarshal(out, &a) != nil || a.Lease == "" {
					fail("take", st, out, err)
				}
				if st, _, err := post(client, base+"/release", []byte(`{"lease":"`+a.Lease+`"}`)); err != nil || st != 200 {
					failed.Add(1) // the slot returns at its lease's end
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Printf("  %s: %d releases not answered 200 (not counted; their slots return at the lease's end)\n", phase, failed.Load())
	}
	return float64(done.Load()) / time.Since(start).Seconds()
}

func fail(what string, st int, out []byte, err error) {
	fmt.Fprintf(os.Stderr, "slotbench: %s: %d %s %v\n", what, st, out, err)
	os.Exit(1)
}

func flight(client *http.Client, bases []string, n int64, workers, keys int, hold time.Duration, leak int, upTo int64, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	var peak, taken, refused, leaked, unreachable, degraded atomic.Int64
	var sharedPeak atomic.Int64 // of slots the store admitted, apart from degraded ones
	// Per key: the callers in flight, and those of them the store admitted.
	inFlight, sharedInFlight := make([]atomic.Int64, keys), make([]atomic.Int64, keys)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			k := w % keys
			body := []byte(`{"key":"flight_key","scope":"work"}`)
			if keys > 1 {
				body = []byte(`{"key":"flight_key_` + strconv.Itoa(k) + `","scope":"work","tier":"flight"}`)
			}
			for ctx.Err() == nil {
				base := bases[rng.IntN(len(bases))]
				st, out, err := post(client, base+"/check", body)
				var a answer
				if err != nil || st != 200 || json.Unmarshal(out, &a) != nil {
					unreachable.Add(1) // a limiter killed or starting: try another
					time.Sleep(time.Millisecond)
					continue
				}
				if !a.Allowed {
					refused.Add(1)
					time.Sleep(time.Duration(rng.Int64N(int64(time.Millisecond))))
					continue
				}
				if taken.Add(1) == upTo {
					cancel() // the callers stop after this slot
				}
				if a.Source == "degraded" {
					degraded.Add(1)
				}
				shared := a.Source != "degraded"
				raise(&peak, inFlight[k].Add(1))
				if shared {
					raise(&sharedPeak, sharedInFlight[k].Add(1))
				}
				time.Sleep(time.Duration(rng.Int64N(int64(hold))))
				inFlight[k].Add(-1)
				if shared {
					sharedInFlight[k].Add(-1)
				}
				if rng.IntN(leak) == 0 {
					leaked.Add(1) // this caller "dies" holding the slot
					continue
				}
				for _, b := range append([]string{base}, bases...) {
					if st, _, err := post(client, b+"/release", []byte(`{"lease":"`+a.Lease+`"}`)); err == nil && st == 200 {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("flight: %d limiters, %d callers, %d keys, n %d, %.0f s: slots taken %d (%d of them degraded: the store not asked in time), refused %d, leaked %d, calls to an unreachable limiter %d\n",
		len(bases), workers, keys, n, time.Since(start).Seconds(), taken.Load(), degraded.Load(), refused.Load(), leaked.Load(), unreachable.Load())
	fmt.Printf("highest peak in flight of a key seen by the callers ÷ n = %d ÷ %d = %.2f (goal ≤ 1.00); of slots the store admitted, %d ÷ %d = %.2f\n",
		peak.Load(), n, float64(peak.Load())/float64(n), sharedPeak.Load(), n, float64(sharedPeak.Load())/float64(n))
}

// raise makes *p at least v.
func raise(p *atomic.Int64, v int64) {
	for old := p.Load(); v > old && !p.CompareAndSwap(old, v); old = p.Load() {
	}
}
