package sharedtier

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The README's "Decision path" states Order and explains each stage in
// Stages' order: the path as Path joins it, not as someone remembers it.
func TestReadmeStatesThePath(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Decision path\n")
	if !ok {
		t.Fatal(`README.md has no "## Decision path" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var order string
	var explained []string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "    ") && strings.Contains(line, " → ") && order == "" {
			order = strings.TrimSpace(line)
		}
		if name, ok := strings.CutPrefix(line, "- **"); ok {
			name, _, _ = strings.Cut(name, "**")
			explained = append(explained, name)
		}
	}
	if order != Order {
		t.Errorf("README's decision path:\n\t%s\nPath's (sharedtier.Order):\n\t%s", order, Order)
	}
	if !reflect.DeepEqual(explained, Stages()) {
		t.Errorf("README explains the stages %q; Path's order is %q", explained, Stages())
	}
}

func TestStages(t *testing.T) {
	want := []string{"transport", "tracing", "local tier", "global", "lease", "split", "store", "guard", "pipeline", "shadow trial", "metrics", "metering"}
	if got := Stages(); !reflect.DeepEqual(got, want) {
		t.Errorf("Stages() = %q, want %q", got, want)
	}
}

// isRun reports whether chain is a run of Stages, in order.
func isRun(chain []string) bool {
	all := strings.Join(Stages(), "|")
	return len(chain) > 0 && strings.Contains("|"+all+"|", "|"+strings.Join(chain, "|")+"|")
}

// Each chain below the local tier is built by chain, and its stages are
// a run of Order's: the enforced tier with and without leases, the shadow
// tier and single-node mode's.
func TestChainsFollowTheOrder(t *testing.T) {
	tier, err := Build(context.Background(), Config{MaxKeys: 1000, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if got := tier.Stages(); !reflect.DeepEqual(got, []string{"split", "store"}) || !isRun(got) {
		t.Errorf("single-node tier: %q", got)
	}
	_, _, shadow := tier.ShadowChain(time.Second, slog.New(slog.DiscardHandler))
	if !reflect.DeepEqual(shadow, []string{"split", "store"}) {
		t.Errorf("single-node shadow chain: %q", shadow)
	}
	var r *Region // a one-region deployment
	if r.Authority() != nil || r.Stages() != nil || r.Count() != 1 {
		t.Error("no region: want no global authority, no stages, one region")
	}
}

func TestChainsFollowTheOrderWithRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	env := map[string]string{"REDIS_ADDRS": srv.Addr(), "REDIS_KEY_PREFIX": "pathtest"}
	e := envconfig.New(func(k string) string { return env[k] })
	rc := redisclient.FromEnv(e, limits.DefaultKeyPrefix)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		leaseBlock int
		want       []string
	}{
		{0, []string{"split", "store", "guard", "pipeline"}},
		{10, []string{"lease", "split", "store", "guard", "pipeline"}},
	} {
		tier, err := Build(context.Background(), Config{Redis: rc, StoreTimeout: time.Second, BreakerFailures: 5,
			BreakerOpenFor: time.Second, MaxKeys: 1000, LeaseBlock: c.leaseBlock, LeaseHotOps: 100, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		if got := tier.Stages(); !reflect.DeepEqual(got, c.want) || !isRun(got) {
			t.Errorf("lease block %d: tier %q, want %q", c.leaseBlock, got, c.want)
		}
		_, _, shadow := tier.ShadowChain(time.Second, log)
		if want := []string{"split", "store", "guard", "pipeline"}; !reflect.DeepEqual(shadow, want) || !isRun(shadow) {
			t.Errorf("shadow chain %q, want %q", shadow, want)
		}
		tier.closeClients()
	}
}

// hookLog records which hook saw a decision, in order.
type hookLog struct {
	mu    sync.Mutex
	calls []string
}

func (h *hookLog) add(s string) { h.mu.Lock(); h.calls = append(h.calls, s); h.mu.Unlock() }

func (h *hookLog) Evaluate(enforcement.Policy, enforcement.Request, enforcement.Decision, time.Time) enforcement.ShadowVerdict {
	h.add("shadow trial")
	return enforcement.ShadowVerdict{}
}
func (h *hookLog) Decided(enforcement.Request, enforcement.Decision, time.Duration) { h.add("metrics") }
func (h *hookLog) AuthorityFailed(error)                                            {}
func (h *hookLog) ClockBack()                                                       {}
func (h *hookLog) Record(enforcement.Request, enforcement.Decision, time.Time)      { h.add("metering") }

// Path joins the hooks so that a decision reaches them in Order's order,
// after the decision, whether the local tier or the store decided it.
func TestPathRunsTheHooksInOrder(t *testing.T) {
	p, err := policy.Parse([]byte("version: 1\ndefault_tier: std\ntiers:\n  std: { rate: 1, burst: 2 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	tier, err := Build(context.Background(), Config{MaxKeys: 1000, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracing.New(func(string) string { return "" }, "limiter") // off: no endpoint
	if err != nil {
		t.Fatal(err)
	}
	hooks := &hookLog{}
	lim, chk, err := Path(enforcement.Config{Policy: p, MaxKeys: 1000},
		Parts{Tracer: tr, Tier: tier, Shadow: hooks, Metrics: hooks, Metering: hooks})
	if err != nil {
		t.Fatal(err)
	}
	_ = lim // Check works from the constructor on; nothing to run

	stages := Stages()
	want := stages[len(stages)-3:]
	for i := range 4 { // the store decides the first, the local tier rejects the last
		hooks.calls = nil
		d, err := chk.Check(context.Background(), enforcement.Request{Key: "k", Scope: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(hooks.calls, want) {
			t.Errorf("decision %d (allowed %v, source %v): hooks %q, want %q", i, d.Allowed, d.Source, hooks.calls, want)
		}
	}
}
