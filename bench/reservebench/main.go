// Command reservebench measures POST /check with a reservation and POST
// /settle beside plain POST /check, in one run against one limiter:
// closed loop, -conns workers on keep-alive connections, -keys keys
// uniformly, each phase -duration, the three phases interleaved -passes
// times, each pass starting with the next phase, so the machine's noise
// shows in every ratio. The settle phase settles reservations made before
// it (not timed), one per request. It prints decisions per second per
// phase and pass, the ratios of the medians and the medians of the
// per-pass ratios.
//
//	reservebench -url http://127.0.0.1:8080 -conns 32 -duration 5s -passes 3
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:8080", "the limiter's base URL")
	conns := flag.Int("conns", 32, "concurrent workers")
	keys := flag.Int("keys", 10000, "keys, uniformly")
	dur := flag.Duration("duration", 5*time.Second, "each phase")
	passes := flag.Int("passes", 3, "interleaved passes")
	flag.Parse()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conns, MaxConnsPerHost: *conns}, Timeout: 10 * time.Second}
	res := map[string][]float64{}
	phases := []string{"check", "reserve", "settle"}
	reserveRate := 30000.0 // sizes the first settle phase's reservations
	for pass := range *passes {
		// Each pass starts one phase later: every reservation leaves a
		// record in Redis for its TTL, so the keyspace grows all run long,
		// and a fixed order would always run one phase on a smaller one.
		for i := range phases {
			phase := phases[(pass+i)%len(phases)]
			var ids chan string
			if phase == "settle" {
				ids = reserveAhead(client, *base, *keys, int(3*reserveRate*dur.Seconds())+1000, *conns)
			}
			rps := run(client, *base, phase, *keys, *conns, *dur, ids)
			res[phase] = append(res[phase], rps)
			if phase == "reserve" {
				reserveRate = rps
			}
			fmt.Printf("pass %d %-8s %10.0f decisions/s\n", pass+1, phase, rps)
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return (s[(len(s)-1)/2] + s[len(s)/2]) / 2 // of an even count, the mean of the middle two
	}
	fmt.Printf("median check %.0f/s, reserve %.0f/s, settle %.0f/s\n", med(res["check"]), med(res["reserve"]), med(res["settle"]))
	fmt.Printf("reserve ÷ check %.2f, settle ÷ check %.2f\n", med(res["reserve"])/med(res["check"]), med(res["settle"])/med(res["check"]))
	ratios := func(phase string) []float64 {
		r := make([]float64, len(res[phase]))
		for i, x := range res[phase] {
			r[i] = x / res["check"][i]
		}
		return r
	}
	rr, sr := ratios("reserve"), ratios("settle")
	fmt.Printf("per pass: reserve ÷ check %.2f (median %.2f), settle ÷ check %.2f (median %.2f)\n", rr, med(rr), sr, med(sr))
}

// body is one request of phase for worker w's i-th call.
func body(phase string, key int, id string) (path string, b []byte) {
	switch phase {
	case "settle":
		return "/settle", []byte(`{"reservation":"` + id + `","cost":7}`)
	case "reserve":
		return "/check", []byte(`{"key":"k` + strconv.Itoa(key) + `","scope":"tokens","cost":10,"reserve":true}`)
	}
	return "/check", []byte(`{"key":"k` + strconv.Itoa(key) + `","scope":"tokens","cost":10}`)
}

func post(client *http.Client, url string, b []byte) ([]byte, error) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return out, fmt.Errorf("status %d: %s", resp.StatusCode, out)
	}
	return out, err
}

// run drives phase flat out for d and returns the answered requests per second.
func run(client *http.Client, base, phase string, keys, conns int, d time.Duration, ids chan string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				var id string
				if ids != nil {
					select {
					case id = <-ids:
					default:
						fmt.Fprintln(os.Stderr, "reservebench: ran out of reservations to settle")
						return
					}
				}
				path, b := body(phase, (w*7919+i*104729)%keys, id)
				if _, err := post(client, base+path, b); err != nil {
					fmt.Fprintln(os.Stderr, "reservebench:", phase, err)
					os.Exit(1)
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// reserveAhead makes n reservations (untimed) for the settle phase.
func reserveAhead(client *http.Client, base string, keys, n, conns int) chan string {
	ids := make(chan string, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				_, b := body("reserve", int(i)%keys, "")
				out, err := post(client, base+"/check", b)
				if err != nil {
					fmt.Fprintln(os.Stderr, "reservebench: reserve:", err)
					os.Exit(1)
				}
				var d struct{ Reservation string }
				if err := json.Unmarshal(out, &d); err != nil || d.Reservation == "" {
					fmt.Fprintf(os.Stderr, "reservebench: no reservation in %s\n", out)
					os.Exit(1)
				}
				ids <- d.Reservation
			}
		}()
	}
	wg.Wait()
	return ids
}
