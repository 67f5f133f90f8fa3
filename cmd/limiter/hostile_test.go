package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/hostile"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The hostile-traffic tests (make stress-test; hostile.Gate skips them
// otherwise) run the real binary against real Redis on loopback, bounded in
// count and time. They assert what must hold however slow the machine is
// (every normal request answered, allowed, not degraded; every slow client
// closed by the server) and report latencies without asserting on them.

const hostilePolicy = `
version: 1
default_tier: std
tiers:
  std:  { rate: 100000, burst: 100000 }
  tiny: { rate: 10, burst: 10 }
keys: { flood: tiny }
`

// hostileEnv: a store deadline a loaded machine cannot miss, so that a
// degraded answer means the flood starved the shared store, not that the
// test machine was slow (the default 5 ms is what production tunes).
func hostileEnv(r *testenv.Redis) []string {
	return []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_STORE_TIMEOUT=1s"}
}

// normalTraffic sends paced /check requests for keys n0..n49 from workers
// goroutines until stop closes (at most limit requests each), and returns
// their latencies and the failures: anything but a 200, allowed, not
// degraded answer.
func normalTraffic(p *limiterProc, workers, limit int, pace time.Duration, stop <-chan struct{}) (lat *hostile.Latencies, failures func() []string) {
	lat = &hostile.Latencies{}
	var mu sync.Mutex
	var fails []string
	var wg sync.WaitGroup
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range limit {
				select {
				case <-stop:
					return
				case <-time.After(pace):
				}
				key := fmt.Sprintf("n%d", (w*limit+i)%50)
				began := time.Now()
				resp, err := c.Post(p.url+"/check", "application/json", strings.NewReader(`{"key":"`+key+`","scope":"api"}`))
				var d decision
				var status int
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
					err = json.Unmarshal(b, &d)
				}
				lat.Add(time.Since(began))
				if err != nil || status != 200 || !d.Allowed || d.Source == "degraded" {
					mu.Lock()
					if len(fails) < 20 {
						fails = append(fails, fmt.Sprintf("%s: status %d %+v %v", key, status, d, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	return lat, func() []string { wg.Wait(); mu.Lock(); defer mu.Unlock(); return fails }
}

// TestHostileFloodBesideNormalTraffic: 16 connections flood one key as
// fast as they can while normal keys are checked at a steady pace; every
// normal request is answered 200, allowed and not degraded, and their
// latency is reported beside the same traffic without the flood.
func TestHostileFloodBesideNormalTraffic(t *testing.T) {
	hostile.Gate(t)
	r := testenv.StartRedis(t)
	p := startLimiter(t, hostilePolicy, hostileEnv(r)...)

	const workers, each, pace = 4, 400, 5 * time.Millisecond
	stop := make(chan struct{})
	base, baseFails := normalTraffic(p, workers, each, pace, stop)
	if f := baseFails(); len(f) > 0 {
		t.Fatalf("normal traffic alone failed: %q", f)
	}

	var flooded, floodAllowed, floodErrors atomic.Int64
	floodStop := make(chan struct{})
	var fwg sync.WaitGroup
	fc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	body := []byte(`{"key":"flood","scope":"api"}`)
	floodBegan := time.Now()
	for range 16 {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			for range 50_000 { // bounded in count, and by floodStop in time
				select {
				case <-floodStop:
					return
				default:
				}
				resp, err := fc.Post(p.url+"/check", "application/json", bytes.NewReader(body))
				if err != nil {
					floodErrors.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				flooded.Add(1)
				if bytes.Contains(b, []byte(`"allowed":true`)) {
					floodAllowed.Add(1)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the flood under way
	during, duringFails := normalTraffic(p, workers, each, pace, stop)
	fails := duringFails()
	close(floodStop)
	fwg.Wait()
	floodFor := time.Since(floodBegan)
	t.Logf("normal keys alone:      %s", base)
	t.Logf("normal keys, one flood: %s", during)
	t.Logf("flood on one key: %d answered in %v (%d allowed, limit rate 10/s burst 10), %d transport errors",
		flooded.Load(), floodFor.Round(time.Millisecond), floodAllowed.Load(), floodErrors.Load())
	if len(fails) > 0 {
		t.Errorf("normal traffic beside the flood: %d+ failures: %q", len(fails), fails)
	}
	// The flood is limited as its tier says: burst + rate × time, measured
	// here around the whole flood (an upper bound of the server's window).
	if ceiling := 10 + 10*floodFor.Seconds(); float64(floodAllowed.Load()) > ceiling+1 {
		t.Errorf("the flood got %d allowed in %v, more than burst + rate × time = %.0f", floodAllowed.Load(), floodFor, ceiling)
	}
	if flooded.Load() < 1000 {
		t.Errorf("the flood sent only %d requests: not a flood", flooded.Load())
	}
	// A sanity bound only (the figures above are the result): far beyond
	// any loaded machine's scheduling delay, below the client's timeout.
	if q := during.Quantile(0.99); q > 5*time.Second {
		t.Errorf("normal keys' p99 %v beside the flood", q)
	}
}

// TestHostileSlowClients: idle connections and slowloris senders (headers
// dribbled, then a body dribbled) are closed by the server's own timeouts
// (run.go: ReadHeaderTimeout 5 s, ReadTimeout 10 s; there is no variable to
// shorten them, so the real ones are waited for) while normal traffic is
// answered throughout.
func TestHostileSlowClients(t *testing.T) {
	hostile.Gate(t)
	r := testenv.StartRedis(t)
	p := startLimiter(t, hostilePolicy, hostileEnv(r)...)
	stop := make(chan struct{})
	lat, fails := normalTraffic(p, 2, 2000, 20*time.Millisecond, stop)
	kinds, err := hostile.SlowClients(context.Background(), strings.TrimPrefix(p.url, "http://"),
		hostile.Slow{Idle: 300, SlowHeaders: 50, SlowBodies: 50, Path: "/check", Bound: 90 * time.Second})
	close(stop)
	f := fails()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		t.Log(k)
		if k.Closed != k.Opened {
			t.Errorf("%s: the server closed %d of %d within 90 s", k.Name, k.Closed, k.Opened)
		}
	}
	t.Logf("normal traffic meanwhile: %s", lat)
	if len(f) > 0 {
		t.Errorf("normal traffic beside the slow clients: %q", f)
	}
	if lat.Len() == 0 {
		t.Error("no normal request was made")
	}
}

// TestHostileBodies: a valid body of exactly 64 KiB is decided; one byte
// more, with Content-Length or chunked, and a 4 MiB body are 413; normal
// traffic beside a stream of oversized bodies is answered throughout.
func TestHostileBodies(t *testing.T) {
	hostile.Gate(t)
	r := testenv.StartRedis(t)
	p := startLimiter(t, hostilePolicy, hostileEnv(r)...)
	padded := func(n int) []byte {
		head := `{"key":"big","scope":"api","pad":"`
		return []byte(head + strings.Repeat("x", n-len(head)-2) + `"}`)
	}
	post := func(body io.Reader, length int64) (int, string) {
		req, err := http.NewRequest(http.MethodPost, p.url+"/check", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length // -1: chunked
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := post(bytes.NewReader(padded(64<<10)), 64<<10); code != 200 || !strings.Contains(b, `"allowed":true`) {
		t.Errorf("exactly 64 KiB: %d %s", code, b)
	}
	if code, b := post(bytes.NewReader(padded(64<<10+1)), 64<<10+1); code != 413 || !strings.Contains(b, "payload_too_large") {
		t.Errorf("64 KiB + 1 with Content-Length: %d %s", code, b)
	}
	if code, b := post(io.MultiReader(bytes.NewReader(padded(64<<10+1))), -1); code != 413 || !strings.Contains(b, "payload_too_large") {
		t.Errorf("64 KiB + 1 chunked: %d %s", code, b)
	}
	stop := make(chan struct{})
	lat, fails := normalTraffic(p, 2, 1000, 10*time.Millisecond, stop)
	var big, big413, bigReset atomic.Int64
	var otherMu sync.Mutex
	var other []string
	var wg sync.WaitGroup
	huge := padded(4 << 20)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				code, b := post(bytes.NewReader(huge), -1)
				big.Add(1)
				switch code {
				case 413:
					big413.Add(1)
				case 0: // the server closed while the client was still sending: refused too
					bigReset.Add(1)
				default:
					otherMu.Lock()
					other = append(other, fmt.Sprintf("%d %.200s", code, b))
					otherMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	f := fails()
	t.Logf("%d chunked 4 MiB bodies: %d answered 413, %d cut off by the server mid-send; normal traffic meanwhile: %s",
		big.Load(), big413.Load(), bigReset.Load(), lat)
	if len(other) > 0 || big413.Load() == 0 {
		t.Errorf("oversized bodies: %d answered 413, and otherwise %q", big413.Load(), other)
	}
	if len(f) > 0 {
		t.Errorf("normal traffic beside the oversized bodies: %q", f)
	}
}

// TestHostileKeyText: keys with NUL bytes, other control characters and
// bytes that are not UTF-8 are refused with 400 invalid_request naming the
// field (httpapi.TextProblem), nothing is spent, every line the limiter
// logged is still one JSON object, and a Unicode key is decided as sent.
func TestHostileKeyText(t *testing.T) {
	hostile.Gate(t)
	r := testenv.StartRedis(t)
	p := startLimiter(t, hostilePolicy, hostileEnv(r)...)
	for _, c := range []struct{ body, want string }{
		{`{"key":"a\u0000b","scope":"api"}`, "key has a control character (U+0000)"},
		{"{\"key\":\"a\xffb\",\"scope\":\"api\"}", "key is not valid UTF-8"},
		{"{\"key\":\"a\xc0\x80\",\"scope\":\"api\"}", "key is not valid UTF-8"},
		{`{"key":"a\r\n{\"level\":\"ERROR\"}","scope":"api"}`, "key has a control character (U+000D)"},
		{`{"key":"k","scope":"api\u001b[2J"}`, "scope has a control character (U+001B)"},
		{"{\"key\":\"k\",\"scope\":\"api\",\"tier\":\"\xfe\"}", "tier is not valid UTF-8"},
	} {
		for range 50 {
			resp, err := client.Post(p.url+"/check", "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || !strings.Contains(string(b), `"invalid_request"`) || !strings.Contains(string(b), c.want) {
				t.Fatalf("%q: %d %s, want 400 invalid_request with %q", c.body, resp.StatusCode, b, c.want)
			}
			if !json.Valid(b) {
				t.Fatalf("%q: the error body is not JSON: %q", c.body, b)
			}
		}
	}
	// The refused keys spent nothing: their valid neighbours have the whole burst.
	if d, code := p.check(t, "ab", "api", 0); code != 200 || d.Remaining != 100000 {
		t.Errorf("after the refusals: %d %+v", code, d)
	}
	if d, code := p.check(t, "usér:é日本😀", "api", 1); code != 200 || !d.Allowed {
		t.Errorf("a Unicode key: %d %+v", code, d)
	}
	for i, line := range strings.Split(strings.TrimSpace(p.logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line %d is not one JSON object: %q", i+1, line)
		}
	}
}
