package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/hostile"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// keyRotationBudget is the resident memory a limiter at its default
// settings must stay under while every request is a new key.
const keyRotationBudget = 256 << 20

// TestHostileKeyRotation floods the real limiter (default settings, the
// demo policy, one redis-server) with a fresh key per request for a bounded
// time (RATEWARDEN_HOSTILE_SECONDS, default 45), sampling its VmRSS every
// half second: the process stays under 256 MiB, every request is answered
// with a decision, the local tier's bytes stay within their bound, and
// afterwards a key flooded past its limit is still rejected. The binary is
// built without the race detector, whose shadow memory would be measured
// instead. Runs only with RATEWARDEN_HOSTILE=1 (make stress-test).
func TestHostileKeyRotation(t *testing.T) {
	hostile.Gate(t)
	seconds := 45
	if v := os.Getenv("RATEWARDEN_HOSTILE_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 600 {
			t.Fatalf("RATEWARDEN_HOSTILE_SECONDS=%q: want 1-600", v)
		}
		seconds = n
	}
	bin := filepath.Join(t.TempDir(), "limiter")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build limiter: %v\n%s", err, out)
	}
	policy, err := os.ReadFile("../../deploy/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := testenv.StartRedis(t)
	p := startLimiterBinary(t, bin, string(policy), "REDIS_ADDRS="+r.Addr(),
		fmt.Sprintf("LIMITER_GRPC_ADDR=127.0.0.1:%d", testenv.FreePort(t)))

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
	defer cancel()
	var sent, answered atomic.Int64
	var failures sync.Map // what went wrong → count
	fail := func(what string) {
		v, _ := failures.LoadOrStore(what, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	flooder := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				body := fmt.Sprintf(`{"key":"ip:2001:db8::%x:%x","scope":"api"}`, w, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/check", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				sent.Add(1)
				resp, err := flooder.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						fail("transport: " + err.Error())
					} else {
						sent.Add(-1) // cut off by the end of the flood, not by the limiter
					}
					continue
				}
				var d decision
				err = json.NewDecoder(resp.Body).Decode(&d)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					fail(fmt.Sprintf("status %d, body not a decision: %v", resp.StatusCode, err))
				case resp.StatusCode != http.StatusOK:
					fail(fmt.Sprintf("status %d", resp.StatusCode))
				default:
					answered.Add(1)
				}
			}
		}(w)
	}
	var peak int64
	var samples []string
	tick := time.NewTicker(500 * time.Millisecond)
	for n, done := 0, false; !done; n++ {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		rss, err := vmRSS(p.cmd.Process.Pid)
		if err != nil {
			t.Fatalf("reading the limiter's VmRSS: %v\n%s", err, p.logs.String())
		}
		peak = max(peak, rss)
		if n%10 == 0 || done { // every 5 s, and the last
			samples = append(samples, fmt.Sprintf("%d MiB", rss>>20))
		}
	}
	tick.Stop()
	wg.Wait()

	local := scrape(t, p.url, "limiter_local_bytes")
	t.Logf("%d requests in %d s, %d answered; VmRSS peak %d MiB (samples %s); local tier %v",
		sent.Load(), seconds, answered.Load(), peak>>20, strings.Join(samples, ", "), local)
	failures.Range(func(k, v any) bool {
		t.Errorf("%d requests: %s", v.(*atomic.Int64).Load(), k)
		return true
	})
	if peak > keyRotationBudget {
		t.Errorf("VmRSS reached %d MiB under key rotation, budget %d MiB", peak>>20, keyRotationBudget>>20)
	}
	if answered.Load() != sent.Load() || sent.Load() == 0 {
		t.Errorf("%d of %d requests answered with a decision", answered.Load(), sent.Load())
	}
	if b := local[`{table="buckets"}`] + local[`{table="quotas"}`]; b > 64<<20 {
		t.Errorf("local tier holds %.0f bytes, over its default bound of 64 MiB", b)
	}
	// Protection still works: a key past its limit (the anonymous rule,
	// burst 5) is rejected (a decision: status 200, allowed false).
	for i := 0; i < 5; i++ {
		p.check(t, "ip:2001:db8::f100d", "api", -1)
	}
	if d, status := p.check(t, "ip:2001:db8::f100d", "api", -1); d.Allowed || status != http.StatusOK {
		t.Errorf("the sixth request of a burst-5 key after the flood: %d %+v", status, d)
	}
}

// vmRSS is a process's resident set size in bytes (/proc/PID/status).
func vmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// scrape returns the samples of one metric from /metrics, by label set.
func scrape(t *testing.T, url, name string) map[string]float64 {
	t.Helper()
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels, value, _ := strings.Cut(rest, " ")
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[labels] = v
		}
	}
	return out
}
