package reload

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// generation returns a valid policy that differs from its neighbours in
// content (hash) and in the limit it sets: even generations give scope
// api:* a burst of 1000 under rule "even", odd ones 2000 under "odd".
func generation(n int) string {
	name, burst := "even", 1000
	if n%2 == 1 {
		name, burst = "odd", 2000
	}
	return fmt.Sprintf(`# generation %d
version: 1
default_tier: free
tiers:
  free: { rate: 1000, burst: 1000 }
rules:
  - name: %s
    scope: "api:*"
    rate: %d
    burst: %d
`, n, name, burst, burst)
}

const brokenPolicy = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 0, burst: 5 }\n"

// writeAtomic writes content next to path and renames it over path, the
// way most editors, sed -i and configuration tools replace a file.
func writeAtomic(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// logSink is a log sink safe for the reloader's goroutine and the test.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// reloadHarness runs a File the way the limiter does, with hup standing
// in for the SIGHUP channel that signal.Notify feeds.
type reloadHarness struct {
	r    *File
	reg  *prometheus.Registry
	logs *logSink
	hup  chan os.Signal
	stop func()
}

func startReloader(t testing.TB, path string, target interface{ SetPolicy(enforcement.Policy) }, initial *policy.Policy) *reloadHarness {
	t.Helper()
	h := &reloadHarness{reg: prometheus.NewRegistry(), logs: &logSink{}, hup: make(chan os.Signal, 1)}
	h.r = NewPolicy(path, target, h.reg, slog.New(slog.NewJSONHandler(h.logs, nil)))
	h.r.Set(initial)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.r.run(ctx, h.hup)
	}()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	return h
}

func (h *reloadHarness) count(result string) int {
	return int(valueOf(h.r.results.WithLabelValues(result)))
}

// valueOf reads a counter or gauge. (prometheus/testutil would need a module
// that go.sum does not hold.)
func valueOf(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}

// seriesOf counts the series of the metric family name in reg.
func seriesOf(t testing.TB, reg *prometheus.Registry, name string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
}

// waitFor polls cond. The deadline only bounds a hung test; no assertion
// here is about speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(20 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustLoad(t testing.TB, path string) *policy.Policy {
	t.Helper()
	p, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func hashOf(p enforcement.Policy) string { return p.(*policy.Policy).Hash() }

func redisLimiter(t testing.TB, initial enforcement.Policy) *enforcement.Limiter {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 32, ContextTimeoutEnabled: true,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "reload"), Policy: initial})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// TestReloadUnderLoad: 100 reloads, driven by file writes (fsnotify) and by
// the SIGHUP channel, while 8 goroutines make decisions through the real
// limiter on a real redis-server. No decision errs or degrades, every one
// is made under one whole policy, and a broken file in the middle is
// refused with a metric and a log line while the previous policy stays.
func TestReloadUnderLoad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, generation(0))
	p0 := mustLoad(t, path)
	lim := redisLimiter(t, p0)
	h := startReloader(t, path, lim, p0)

	var (
		stop      atomic.Bool
		decisions atomic.Int64
		failures  = make(chan string, 100)
		wg        sync.WaitGroup
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for i := 0; !stop.Load(); i++ {
				req := enforcement.Request{Key: fmt.Sprintf("k%d-%d", w, i%200), Scope: "api:x"}
				d, err := lim.Check(ctx, req)
				decisions.Add(1)
				switch {
				case err != nil:
					failures <- fmt.Sprintf("decision error: %v", err)
				case d.Source == enforcement.SourceDegraded:
					failures <- "a decision was degraded: the store could not be asked"
				case !(d.Policy == "even" && d.Limit == 1000) && !(d.Policy == "odd" && d.Limit == 2000):
					failures <- fmt.Sprintf("decision under no whole policy: policy %q limit %d", d.Policy, d.Limit)
				default:
					continue
				}
				return
			}
		}()
	}

	for gen := 1; gen <= 100; gen++ {
		if gen == 50 {
			// A broken file: refused, counted, logged; nothing changes.
			before, inForce := h.count("refused"), lim.Policy()
			writeAtomic(t, path, brokenPolicy)
			h.hup <- syscall.SIGHUP
			// Counted, then marked, then logged: wait for all three rather
			// than racing the last two.
			eventually(t, "the broken file to be refused, marked and logged", func() bool {
				return h.count("refused") > before && valueOf(h.r.lastOK) == 0 &&
					strings.Contains(h.logs.String(), "tiers.free.rate (line 4)")
			})
			if lim.Policy() != inForce {
				t.Fatal("a refused file replaced the policy in force")
			}
			if g := valueOf(h.r.lastOK); g != 0 {
				t.Fatalf("limiter_policy_last_reload_successful = %v after a refusal", g)
			}
			if h.r.Current().Hash != hashOf(inForce) {
				t.Fatal("the reported policy changed on a refusal")
			}
			if !strings.Contains(h.logs.String(), "policy refused; the previous policy stays in force") ||
				!strings.Contains(h.logs.String(), "tiers.free.rate (line 4)") {
				t.Fatalf("no log line with the reason:\n%s", h.logs.String())
			}
			d, err := lim.Check(context.Background(), enforcement.Request{Key: "probe", Scope: "api:x"})
			if err != nil || d.Policy != "odd" {
				t.Fatalf("after the refusal: policy %q (err %v), want generation 49's \"odd\"", d.Policy, err)
			}
		}
		writeAtomic(t, path, generation(gen))
		if gen%10 != 0 {
			h.hup <- syscall.SIGHUP // else: the file watch alone must notice
		}
		want := gen
		eventually(t, fmt.Sprintf("reload %d", gen), func() bool { return h.count("ok") >= want })
		if got := h.count("ok"); got != gen {
			t.Fatalf("%d reloads counted after %d distinct files", got, gen)
		}
		if got, want := hashOf(lim.Policy()), mustLoad(t, path).Hash(); got != want {
			t.Fatalf("generation %d: limiter has %s, file is %s", gen, got, want)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	if g := valueOf(h.r.lastOK); g != 1 {
		t.Errorf("limiter_policy_last_reload_successful = %v after a good file", g)
	}
	final := h.r.Current()
	if v := valueOf(h.r.info.WithLabelValues("1", final.Hash)); v != 1 {
		t.Errorf("limiter_policy_info{hash=%s} = %v", final.Hash, v)
	}
	if n := seriesOf(t, h.reg, "limiter_policy_info"); n != 1 {
		t.Errorf("limiter_policy_info has %d series, want only the policy in force", n)
	}
	t.Logf("%d decisions during 100 reloads; %d refused", decisions.Load(), h.count("refused"))
	if decisions.Load() < 100 {
		t.Errorf("only %d decisions ran during the reloads", decisions.Load())
	}
}

// TestReloadOnEditorSaves: the three ways editors save a file each reload
// the policy without a signal.
func TestReloadOnEditorSaves(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeAtomic(t, path, generation(0))
	p0 := mustLoad(t, path)
	lim, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1<<20), Policy: p0})
	if err != nil {
		t.Fatal(err)
	}
	h := startReloader(t, path, lim, p0)

	saves := []struct {
		name string
		save func(content string)
	}{
		{"write a temporary file, rename it over", func(c string) { writeAtomic(t, path, c) }},
		{"vim: move the original aside, write a new file", func(c string) {
			if err := os.Rename(path, path+"~"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Remove(path + "~")
		}},
		{"truncate and write in place", func(c string) {
			if err := os.WriteFile(path, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for i, s := range saves {
		s.save(generation(i + 1))
		want := mustLoad(t, path).Hash()
		eventually(t, s.name, func() bool { return hashOf(lim.Policy()) == want })
	}
	// The last reload is counted just after it takes effect.
	eventually(t, "every save counted", func() bool { return h.count("ok") >= len(saves) })
	if got := h.count("ok"); got != len(saves) {
		t.Errorf("%d reloads, want %d", got, len(saves))
	}

	// A deleted file is refused; the policy stays; putting one back reloads.
	inForce := lim.Policy()
	os.Remove(path)
	eventually(t, "the deleted file to be refused", func() bool { return h.count("refused") > 0 })
	if lim.Policy() != inForce {
		t.Fatal("deleting the file changed the policy")
	}
	writeAtomic(t, path, generation(10))
	want := mustLoad(t, path).Hash()
	eventually(t, "the file put back", func() bool { return hashOf(lim.Policy()) == want })
}

// TestReloadOnConfigMapSwap: Kubernetes mounts a ConfigMap as
// dir/policy.yaml → ..data/policy.yaml, ..data → ..<timestamp>, and
// updates it by pointing a new ..data symlink at a new directory with one
// rename. The file itself never changes, yet the policy must reload.
func TestReloadOnConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "policy.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(name string) {
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_29_10_00_00.1", generation(0))
	if err := os.Symlink("..2026_11_29_10_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.Symlink(filepath.Join("..data", "policy.yaml"), path); err != nil {
		t.Fatal(err)
	}
	p0 := mustLoad(t, path)
	lim, err := enforcement.New(enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 1<<20), Policy: p0})
	if err != nil {
		t.Fatal(err)
	}
	h := startReloader(t, path, lim, p0)

	for i, name := range []string{"..2026_11_29_10_05_00.2", "..2026_11_29_10_10_00.3"} {
		version(name, generation(i+1))
		swap(name)
		want := mustLoad(t, path).Hash()
		eventually(t, "the ConfigMap swap to "+name, func() bool { return hashOf(lim.Policy()) == want })
		// The reload is counted just after it takes effect.
		eventually(t, "the swap to "+name+" counted", func() bool { return h.count("ok") >= i+1 })
		if got := h.count("ok"); got != i+1 {
			t.Fatalf("%d reloads after %d swaps", got, i+1)
		}
	}
	// A swap to a broken file is refused like any other.
	version("..2026_11_29_10_15_00.4", brokenPolicy)
	inForce := lim.Policy()
	swap("..2026_11_29_10_15_00.4")
	eventually(t, "the broken swap to be refused", func() bool { return h.count("refused") > 0 })
	if lim.Policy() != inForce {
		t.Fatal("a broken ConfigMap replaced the policy")
	}
}

// A secret's re-read is counted by result; a failure keeps what was in
// force (the caller's reload leaves it) and says so.
func TestSecretCountsResults(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &logSink{}
	fail := false
	hup := Secret("redis", func() error {
		if fail {
			return fmt.Errorf("REDIS_PASSWORD_FILE: no such file")
		}
		return nil
	}, reg, slog.New(slog.NewJSONHandler(logs, nil)))
	hup()
	fail = true
	hup()
	hup()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["ok"] != 1 || got["failed"] != 2 || !strings.Contains(logs.String(), "REDIS_PASSWORD_FILE") {
		t.Errorf("limiter_secret_reloads_total %v, logs %s; want ok 1, failed 2, the variable named", got, logs)
	}
}
