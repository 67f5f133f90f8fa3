package regions

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// startService runs bin until the test's cleanup (SIGTERM), and logs the
// tail of its output when the test failed.
func startService(t *testing.T, name, bin, addrVar, ready string, env ...string) *testenv.Limiter {
	t.Helper()
	p, err := testenv.StartServiceProcess(name, bin, filepath.Join(t.TempDir(), name+".log"), addrVar, ready, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s, last lines:\n%s", name, p.LogTail(40))
		}
	})
	testenv.FailOnRaceReport(t, name, func() string {
		b, _ := os.ReadFile(p.LogPath)
		return string(b)
	})
	return p
}

// The test's keys (policy, main_test.go) refill slowly, so that its
// checks are rejected as well as admitted however slowly the machine sends
// them (the regions admit at most burst + rate × d + 3 pool_max of
// acct_world's 180 in d): acct_world (world: 1/s, burst 20) is one limit
// for every region, acct_here (here: 1/s, burst 10) each region's own.
const (
	usageAdmin  = "regions-usage-admin-token-0123456789"
	worldChecks = 60 // /check of acct_world per region, cost 1
	hereChecks  = 20 // /check of acct_here per region, cost 2
	// A region's checks of a key are paced: a cold pool rejects until its
	// refiller has leased, so checks sent faster than that would all be
	// rejected in every region.
	checkEvery = 50 * time.Millisecond
)

// counts are the counters of one key in one region, as the rollups and
// the usage API keep them: cost is the allowed decisions' cost.
type counts struct{ Requests, Allowed, Rejected, Cost uint64 }

func (c *counts) add(o counts) {
	c.Requests, c.Allowed, c.Rejected, c.Cost = c.Requests+o.Requests, c.Allowed+o.Allowed, c.Rejected+o.Rejected, c.Cost+o.Cost
}

// TestUsageAcrossRegionsIsExact: the real limiters of regions a, b and c
// emit their decision events to one central Kafka (the decisions topic's
// default deployment, docs/regions-usage.md), one meter-consumer writes
// them to ClickHouse. For a global key and a regional key, decisions_raw
// holds per region exactly the decisions the test was answered there;
// every rollup, and the usage-api binary's GET /v1/usage, hold their sum
// over regions, and with group_by=region each region's own counts.
func TestUsageAcrossRegionsIsExact(t *testing.T) {
	meterBin, apiBin := testenv.Binary(t, "cmd/meter-consumer"), testenv.Binary(t, "cmd/usage-api")
	start := time.Now()
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	conn := ch.Conn(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 4)
	store := []string{"KAFKA_BROKERS=" + k.Addr(), "KAFKA_TOPIC=" + k.Topic(), "CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db}
	startService(t, "meter-consumer", meterBin, "METER_ADDR", "/readyz", append(store, "METER_BATCH_WAIT=50ms")...)
	api := startService(t, "usage-api", apiBin, "USAGE_API_ADDR", "/readyz",
		append(store, "USAGE_ADMIN_TOKEN="+usageAdmin, "USAGE_TOKEN_SECRET=regions-usage-secret-0123456789ab")...)
	bed := testenv.StartRegions(t, testenv.RegionsConfig{LimiterBin: testenv.Binary(t, "cmd/limiter"), Policy: policy, Kafka: k})
	t.Logf("started in %v", time.Since(start))

	// Every region sends its checks of both keys at once, the regions
	// side by side: the global key's decisions interleave across regions.
	// A machine slower than the pace sends as fast as it can.
	type rk struct{ region, key string }
	var mu sync.Mutex
	seen := map[rk]*counts{}
	var errs []error
	var wg sync.WaitGroup
	sendStart := time.Now()
	for _, name := range bed.Names() {
		r := bed.Region(name)
		for _, c := range []struct {
			key        string
			cost, sent int
		}{{"acct_world", 1, worldChecks}, {"acct_here", 2, hereChecks}} {
			got := &counts{}
			seen[rk{name, c.key}] = got
			wg.Go(func() {
				tk := time.NewTicker(checkEvery)
				defer tk.Stop()
				for range c.sent {
					<-tk.C
					d, err := r.Check(c.key, "api", c.cost)
					mu.Lock()
					if err != nil {
						errs = append(errs, fmt.Errorf("region %s, %s: %w", name, c.key, err))
					} else {
						got.Requests++
						if d.Allowed {
							got.Allowed++
							got.Cost += uint64(c.cost)
						} else {
							got.Rejected++
						}
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d checks answered in %v", len(bed.Names())*(worldChecks+hereChecks), time.Since(sendStart))
	// A check without an answer may or may not have been decided (and
	// recorded): the test's ground truth is only what it was answered.
	if len(errs) > 0 {
		t.Fatalf("%d checks not answered, the first: %v", len(errs), errs[0])
	}
	want := map[string]map[string]counts{} // key → region → counts
	total := map[string]counts{}           // key → summed over regions
	for _, key := range []string{"acct_world", "acct_here"} {
		want[key] = map[string]counts{}
		for _, name := range bed.Names() {
			c := *seen[rk{name, key}]
			want[key][name] = c
			s := total[key]
			s.add(c)
			total[key] = s
			t.Logf("region %s, %s: %+v", name, key, c)
		}
	}
	if w := total["acct_world"]; w.Allowed == 0 || w.Rejected == 0 {
		t.Fatalf("acct_world over the regions: %+v; want admitted and rejected decisions both", w)
	}
	recorded := time.Now()

	// decisions_raw: each region's own decisions, each event once.
	waitRegions(t, "decisions_raw", want, func(ctx context.Context) (map[string]map[string]counts, error) {
		got := map[string]map[string]counts{}
		rows, err := conn.Query(ctx, "SELECT key, region, count(), uniqExact(event_id), countIf(allowed = 1), sumIf(cost, allowed = 1) FROM "+
			db+".decisions_raw GROUP BY key, region")
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		for rows.Next() {
			var key, region string
			var c counts
			var distinct uint64
			if err := rows.Scan(&key, &region, &c.Requests, &distinct, &c.Allowed, &c.Cost); err != nil {
				return nil, err
			}
			if distinct != c.Requests {
				return nil, fmt.Errorf("%s in region %q: %d rows of %d distinct event ids", key, region, c.Requests, distinct)
			}
			c.Rejected = c.Requests - c.Allowed
			if got[key] == nil {
				got[key] = map[string]counts{}
			}
			got[key][region] = c
		}
		return got, rows.Err()
	})

	// Every rollup: the sum over regions; every per-region rollup: each
	// region's own.
	sums := map[testenv.UsageKey]testenv.UsageTotal{}
	for key, c := range total {
		sums[testenv.UsageKey{Key: key, Scope: "api"}] = testenv.UsageTotal{Requests: c.Requests, Allowed: c.Allowed, Rejected: c.Rejected, Cost: c.Cost}
	}
	testenv.WaitUsageTotals(t, conn, db, sums, 2*time.Minute)
	for _, table := range schema.RegionRollupTables() {
		waitRegions(t, table, want, func(ctx context.Context) (map[string]map[string]counts, error) {
			return regionRollup(ctx, conn, db+"."+table)
		})
	}

	// The usage API: a key summed over regions, and per region with
	// group_by=region, in every window.
	from, to := start.Add(-time.Hour).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, window := range []string{"minute", "hour", "day"} {
		for key := range want {
			summed, byRegion := readUsage(t, api.URL, key, window, from, to)
			if summed != total[key] {
				t.Errorf("GET /v1/usage of %s, window %s: %+v, want the sum over regions %+v", key, window, summed, total[key])
			}
			if fmt.Sprint(byRegion) != fmt.Sprint(want[key]) {
				t.Errorf("GET /v1/usage of %s, window %s, group_by=region: %v, want %v", key, window, byRegion, want[key])
			}
		}
	}
	t.Logf("recorded and read back in %v; the whole test %v", time.Since(recorded), time.Since(start))
}

// waitRegions waits until read gives want (key → region → counts) and
// fails the test with the difference if that has not happened within two
// minutes; at once when a count is over (counts never go down).
func waitRegions(t *testing.T, what string, want map[string]map[string]counts, read func(context.Context) (map[string]map[string]counts, error)) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(2 * time.Minute))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := read(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		for key, regions := range got {
			for region, g := range regions {
				if w := want[key][region]; g.Requests > w.Requests || g.Allowed > w.Allowed || g.Rejected > w.Rejected {
					t.Fatalf("%s counts more than the answers: %s in region %q %+v, want %+v (all: %v, want %v)", what, key, region, g, w, got, want)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after 2 min: %v, want %v", what, got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// regionRollup reads a per-region rollup's counts by key and region.
func regionRollup(ctx context.Context, conn driver.Conn, table string) (map[string]map[string]counts, error) {
	rows, err := conn.Query(ctx, "SELECT key, region, sum(requests), sum(allowed), sum(rejected), sum(cost) FROM "+table+" WHERE key != '' GROUP BY key, region")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[string]map[string]counts{}
	for rows.Next() {
		var key, region string
		var c counts
		if err := rows.Scan(&key, &region, &c.Requests, &c.Allowed, &c.Rejected, &c.Cost); err != nil {
			return nil, err
		}
		if got[key] == nil {
			got[key] = map[string]counts{}
		}
		got[key][region] = c
	}
	return got, rows.Err()
}

// readUsage is GET /v1/usage of key in window: its totals, and with
// group_by=region its points summed per region.
func readUsage(t *testing.T, base, key, window, from, to string) (counts, map[string]counts) {
	t.Helper()
	get := func(groupBy string) (out struct {
		Series []struct {
			Region *string `json:"region"`
			counts
		} `json:"series"`
		Totals counts `json:"totals"`
	}) {
		t.Helper()
		q := url.Values{"key": {key}, "window": {window}, "from": {from}, "to": {to}}
		if groupBy != "" {
			q.Set("group_by", groupBy)
		}
		req, err := http.NewRequest("GET", base+"/v1/usage?"+q.Encode(), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+usageAdmin)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/usage?%s: %d %s", q.Encode(), resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("GET /v1/usage?%s: %q: %v", q.Encode(), b, err)
		}
		return out
	}
	summed := get("").Totals
	grouped := get("region")
	byRegion := map[string]counts{}
	for _, p := range grouped.Series {
		if p.Region == nil {
			t.Fatalf("GET /v1/usage of %s, group_by=region: a point without region", key)
		}
		c := byRegion[*p.Region]
		c.add(p.counts)
		byRegion[*p.Region] = c
	}
	if grouped.Totals != summed {
		t.Errorf("GET /v1/usage of %s, window %s: totals %+v with group_by=region, %+v without", key, window, grouped.Totals, summed)
	}
	return summed, byRegion
}
