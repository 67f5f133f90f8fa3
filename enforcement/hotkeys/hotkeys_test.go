package hotkeys_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/hotkeys"
	"github.com/ratewarden/ratewarden/enforcement/keyname"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestTopKUnderZipf: with a Zipf stream over 100,000 keys plus one key at
// 40% of the traffic, the sketch (bounded memory) finds the true top 10.
func TestTopKUnderZipf(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	tr := hotkeys.New(hotkeys.Config{Capacity: 32, Shards: 8, Window: 10 * time.Second, Now: clk.now})
	rng := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(rng, 1.2, 1, 99_999)
	truth := map[string]int{}
	const n = 200_000
	for i := range n {
		k := "hot"
		if rng.Float64() >= 0.4 {
			k = fmt.Sprintf("k%d", z.Uint64())
		}
		truth[k]++
		tr.Record(k, "api", i%2 == 0)
		if i%20000 == 0 {
			clk.add(500 * time.Millisecond)
		}
	}
	snap := tr.Snapshot(10)
	if len(snap.Keys) != 10 {
		t.Fatalf("%d keys, want 10", len(snap.Keys))
	}
	if snap.Keys[0].Key != "hot" {
		t.Fatalf("hottest %q, want hot", snap.Keys[0].Key)
	}
	// Every reported key's count brackets the truth: truth ≤ count ≤ truth + err.
	type kc struct {
		k string
		c int
	}
	var sorted []kc
	for k, c := range truth {
		sorted = append(sorted, kc{k, c})
	}
	for i := range sorted { // partial selection of the true top 10
		for j := i + 1; j < len(sorted); j++ {
			if sorted[j].c > sorted[i].c {
				sorted[i], sorted[j] = sorted[j], sorted[i]
			}
		}
		if i == 9 {
			break
		}
	}
	want := map[string]bool{}
	for _, s := range sorted[:10] {
		want[s.k] = true
	}
	secs := snap.WindowSeconds
	for _, k := range snap.Keys {
		got := k.OpsPerSecond * secs
		tru := float64(truth[k.Key])
		if got+0.5 < tru || got-k.MaxOverestimate*secs > tru+0.5 {
			t.Errorf("%s: counted %.0f (error ≤ %.0f), true %.0f", k.Key, got, k.MaxOverestimate*secs, tru)
		}
		if !want[k.Key] {
			t.Errorf("%s reported in the top 10 but is not in the true top 10 (%v)", k.Key, sorted[:10])
		}
	}
	if snap.Shards[0].Shard != "redis" || snap.TotalOpsPerSecond*secs < n-1 {
		t.Fatalf("shards %+v total %.0f", snap.Shards, snap.TotalOpsPerSecond*secs)
	}
}

func TestWindowsRotate(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	tr := hotkeys.New(hotkeys.Config{Window: time.Second, Now: clk.now,
		Owner: func(s uint16) string { return fmt.Sprintf("shard%d", s/8192) }})
	for range 100 {
		tr.Record("a", "s", true)
	}
	clk.add(1500 * time.Millisecond)
	for range 50 {
		tr.Record("b", "s", false)
	}
	snap := tr.Snapshot(10)
	if len(snap.Keys) != 2 || snap.Keys[0].Key != "a" {
		t.Fatalf("keys %+v", snap.Keys)
	}
	// Over 1.5 s (the previous window of 1 s plus 0.5 s of the current one).
	if got := snap.Keys[0].OpsPerSecond; got < 66 || got > 67 {
		t.Fatalf("a: %.1f ops/s, want 100/1.5", got)
	}
	if snap.Keys[0].SharedOpsPerSecond != snap.Keys[0].OpsPerSecond || snap.Keys[1].SharedOpsPerSecond != 0 {
		t.Fatalf("shared rates %+v", snap.Keys)
	}
	clk.add(5 * time.Second) // silence: old windows say nothing about now
	if snap = tr.Snapshot(10); len(snap.Keys) != 0 {
		t.Fatalf("after silence: %+v", snap.Keys)
	}
}

func TestHandlerAndCollector(t *testing.T) {
	tr := hotkeys.New(hotkeys.Config{})
	obs := hotkeys.Observer{Tracker: tr}
	for i := range 1000 {
		for j := 0; j <= i%50; j++ {
			obs.Decided(enforcement.Request{Key: fmt.Sprintf("k%d", i), Scope: "s"},
				enforcement.Decision{Source: enforcement.SourceShared}, time.Microsecond)
		}
	}
	names := keyname.New([]byte("test-secret"))
	srv := httptest.NewServer(hotkeys.Handler(tr, names))
	defer srv.Close()
	res, err := http.Get(srv.URL + "/admin/hot-keys?limit=3")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var snap hotkeys.Snapshot
	if err := json.NewDecoder(res.Body).Decode(&snap); err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || len(snap.Keys) != 3 || len(snap.Shards) != 1 || snap.Keys[0].OpsPerSecond <= 0 {
		t.Fatalf("status %d snapshot %+v", res.StatusCode, snap)
	}
	for _, k := range snap.Keys { // the operator's map from a series to its key
		if k.MetricKey != names.Name(k.Key) || k.MetricKey == k.Key {
			t.Fatalf("key %q shown with metric key %q, want %q", k.Key, k.MetricKey, names.Name(k.Key))
		}
	}
	for _, bad := range []string{"?limit=0", "?limit=x", "?limit=100000"} {
		r, err := http.Get(srv.URL + "/admin/hot-keys" + bad)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 400 {
			t.Errorf("%s: status %d, want 400", bad, r.StatusCode)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(hotkeys.NewCollector(tr, names))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "key" && (strings.HasPrefix(l.GetValue(), "k") || len(l.GetValue()) != 16) {
					t.Fatalf("%s carries key=%q: a raw key, not its name", mf.GetName(), l.GetValue())
				}
			}
		}
	}
	if series["limiter_hot_key_ops_per_second"] != 10 || series["limiter_hot_key_shared_ops_per_second"] != 10 {
		t.Fatalf("hot-key series for 1000 keys: %v, want exactly 10 each", series)
	}
	if series["limiter_shard_ops_per_second"] != 1 {
		t.Fatalf("shard series: %v, want 1", series)
	}
}

func BenchmarkRecord(b *testing.B) {
	tr := hotkeys.New(hotkeys.Config{})
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%d", i)
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tr.Record(keys[i%len(keys)], "api", true)
			i++
		}
	})
}
