package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/metering/reconcile"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const regionsPolicy = `
version: 1
default_tier: free
tiers:
  free:  { rate: 100000, burst: 100000 }
  local: { rate: 100000, burst: 100000, quota: { limit: 1000, period: month } }
  world: { rate: 100000, burst: 100000, scope: global, quota: { limit: 1000, period: month } }
keys: { acct_local: local, acct_world: world }
`

// recordIn writes n allowed decisions of cost each, decided in region.
func (e *env) recordIn(region, key, tier string, cost uint64, n int) {
	e.t.Helper()
	var recs []chsink.Record
	for i := 0; i < n; i++ {
		e.offset++
		recs = append(recs, chsink.Record{Offset: e.offset, Event: metering.Event{
			EventID: fmt.Sprintf("ev-%d", e.offset), TS: e.now.Load().UnixMilli(), Key: key, Scope: "api", Tier: tier,
			Cost: cost, Allowed: true, Source: "shared", Policy: tier, Instance: "test", Region: region,
		}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var p chsink.Progress
	for i := range p {
		p[i] = recs[0].Offset - 1
	}
	if err := e.sink.Write(ctx, 0, recs, e.offset, &p); err != nil {
		e.t.Fatal(err)
	}
}

// A reconciler given its region raises a regional quota counter in the
// region's Redis to that region's usage only (each region enforces its
// own), and a global one, kept at the home as enforcement/global keeps it,
// to every region's usage summed (one quota shared by every region);
// without a region it counts all usage in its one Redis, as before.
func TestRegionalAndGlobalQuotasAcrossRegions(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, regionsPolicy, nil)
	for _, region := range []string{"a", "b", "c"} {
		e.recordIn(region, "acct_local", "local", 10, map[string]int{"a": 3, "b": 5, "c": 7}[region])
		e.recordIn(region, "acct_world", "world", 10, map[string]int{"a": 2, "b": 4, "c": 6}[region])
	}
	e.recordIn("", "acct_local", "local", 10, 1) // recorded without a region
	reader, err := quotause.NewReader(e.conn, e.db)
	if err != nil {
		t.Fatal(err)
	}
	home := testenv.StartRedis(t) // the home region's Redis: global quota counters
	homeDB := newClient(home.Addr())
	defer homeDB.Close()
	inA, err := reconcile.New(reconcile.Config{Redis: rdb, KeyPrefix: e.prefix, Rows: reader, Policy: e.pol.Get, Region: "a",
		GlobalRedis: homeDB, GlobalKeyPrefix: "home",
		Now: func() time.Time { return *e.now.Load() }, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := inA.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.counter("acct_local", "tier:local", limits.PeriodMonth); got != 30 {
		t.Fatalf("regional quota in region a raised to %d, want 30 (region a's usage only)", got)
	}
	start, _ := limits.PeriodMonth.Window(*e.now.Load())
	if got, err := homeDB.Get(ctx, limits.QuotaKey("home:g", "acct_world", "tier:world", start)).Int64(); err != nil || got != 120 {
		t.Fatalf("global quota at the home raised to %d (%v), want 120 (every region's usage)", got, err)
	}
	if got := e.counter("acct_world", "tier:world", limits.PeriodMonth); got != -1 {
		t.Fatalf("a global quota counter in the region's Redis: %d", got)
	}
	// One region (no region given): everything recorded counts.
	e.pass()
	if got := e.counter("acct_local", "tier:local", limits.PeriodMonth); got != 160 {
		t.Fatalf("one-region reconciler: regional quota %d, want 160", got)
	}
	if _, err := reconcile.New(reconcile.Config{Redis: rdb, Rows: rowsOnly{}, Policy: e.pol.Get, Region: "a"}); err == nil {
		t.Fatal("a region without per-region rows was accepted")
	}
}

type rowsOnly struct{}

func (rowsOnly) Rows(context.Context, time.Time, string) ([]quotause.Row, error) { return nil, nil }
