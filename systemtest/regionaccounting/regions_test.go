package regionaccounting_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/metering/notify"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var ch *testenv.ClickHouse

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(testenv.MainWithClickHouse(m, &ch))
}

const (
	secret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	adminToken = "regions-admin-token-0123456789"
	limit      = 300 // the global key's limit: the soft limit (80%) is at 240
)

// run starts fn in a goroutine owned by the test: stopped and waited for
// at cleanup.
func run(t *testing.T, name string, fn func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && ctx.Err() == nil {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(testenv.Timeout(30 * time.Second)):
				t.Errorf("%s did not stop within 30 s", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func quiet() *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// TestThreeRegionsOneRecord: the limiters of regions a, b and c emit into
// one decisions topic (each its own emitter, as each limiter has); one
// meter-consumer writes one ClickHouse. A global key's usage summed over
// regions and per region is exact in the rollups and through the usage
// API's handler (group_by=region); a regional key's is too; and the soft
// limit of the global key, crossed by the sum of the regions (each region's
// share stays below it), is notified once although warnings come from every
// region.
func TestThreeRegionsOneRecord(t *testing.T) {
	testenv.SkipShort(t)
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKafka(t, "decisions", 4)

	// The webhook receiver, checking every signature.
	key, err := notify.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var hooks []map[string]any
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := notify.Verify(key, r.Header, body, time.Now(), 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var b map[string]any
		_ = json.Unmarshal(body, &b)
		mu.Lock()
		hooks = append(hooks, b)
		mu.Unlock()
	}))
	defer recv.Close()

	// One meter-consumer: the ClickHouse writer and the notifier.
	sink, err := chsink.New(conn, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := consumer.New(consumer.Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), Sink: sink, Ping: conn.Ping,
		BatchSize: 200, BatchWait: 100 * time.Millisecond, SessionTimeout: 2 * time.Second, Logger: quiet(), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "consumer", cons.Run)
	nreg := prometheus.NewRegistry()
	notifier, err := notify.New(notify.Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), URL: recv.URL, Secret: secret,
		Retry: notify.Schedule{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond, Attempts: 6}, AttemptTimeout: 30 * time.Second,
		SessionTimeout: 2 * time.Second, RecordEvery: 50 * time.Millisecond, Conn: conn, Database: db, Registry: nreg, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "notifier", notifier.Run)

	// Three regions' limiters, one emitter each, all on the one topic.
	regions := []string{"a", "b", "c"}
	emitters := map[string]*kafkaemit.Emitter{}
	stops := map[string]func(){}
	for _, r := range regions {
		em, err := kafkaemit.New(kafkaemit.Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), BatchWait: 5 * time.Millisecond,
			Logger: quiet(), Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		emitters[r] = em
		stops[r] = run(t, "emitter "+r, em.Run)
	}

	// acct_world is global: one limit of 300 shared by the regions, whose
	// decisions interleave; the limiter marks warning from the decision at
	// which the global use reaches 80%, whichever region made it. Region a
	// makes 100 of its 330 decisions, b 120, c 110: none reaches the soft
	// limit alone. acct_here is regional (each region its own limit).
	ids := metering.NewIDs()
	now := time.Now()
	var all []metering.Event
	world := map[string]usage.Counts{}
	share := []string{"a", "b", "c", "b", "a", "c", "b", "c", "a", "b", "c"} // interleaved; a region that has made its share is skipped
	counts := map[string]int{}
	want := map[string]int{"a": 100, "b": 120, "c": 110}
	used := int64(0)
	for i := 0; len(all) < 330; i++ {
		r := share[i%len(share)]
		if counts[r] == want[r] {
			continue
		}
		counts[r]++
		used++
		ev := metering.Event{EventID: ids.Next(now), TS: now.UnixMilli() + int64(len(all)), Key: "acct_world", Scope: "api", Tier: "world",
			Cost: 1, Allowed: used <= limit, Source: "shared", Remaining: max(limit-used, 0), Limit: limit, Policy: "world",
			Warning: float64(used) >= 0.8*limit, Instance: "lim-" + r, Region: r}
		all = append(all, ev)
		c := world[r]
		c.Requests++
		if ev.Allowed {
			c.Allowed++
			c.Cost += ev.Cost
		} else {
			c.Rejected++
		}
		if ev.Warning {
			c.Warnings++
		}
		world[r] = c
	}
	for ri, r := range regions {
		for i := 0; i < 20*(ri+1); i++ {
			all = append(all, metering.Event{EventID: ids.Next(now), TS: now.UnixMilli() + int64(len(all)), Key: "acct_here", Scope: "api", Tier: "local",
				Cost: 2, Allowed: true, Source: "shared", Remaining: 100, Limit: 1000, Policy: "local", Instance: "lim-" + r, Region: r})
		}
	}
	warnedIn := map[string]bool{}
	for _, ev := range all {
		emitters[ev.Region].Emit(ev)
		if ev.Warning {
			warnedIn[ev.Region] = true
		}
	}
	if len(warnedIn) != 3 {
		t.Fatalf("the test's warnings come from %d regions, want 3", len(warnedIn))
	}
	for _, r := range regions {
		stops[r]() // flushes what it holds
	}

	// The sum over regions, exact in every rollup.
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(all), 90*time.Second)

	// Per region, exact in every per-region rollup.
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for _, table := range schema.RegionRollupTables() {
		for {
			got := map[string]usage.Counts{}
			rows, err := conn.Query(context.Background(), "SELECT region, sum(requests), sum(allowed), sum(rejected), sum(cost), sum(warnings) FROM "+
				db+"."+table+" WHERE key = 'acct_world' GROUP BY region")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var r string
				var c usage.Counts
				if err := rows.Scan(&r, &c.Requests, &c.Allowed, &c.Rejected, &c.Cost, &c.Warnings); err != nil {
					t.Fatal(err)
				}
				got[r] = c
			}
			rows.Close()
			if fmt.Sprint(got) == fmt.Sprint(world) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s per region: %v, want %v", table, got, world)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// The usage API's own handler: summed by default, per region on request.
	store, err := usage.NewStore(conn, db)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := usage.NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := usage.New(usage.Config{Store: store, Signer: signer, AdminToken: adminToken, QueryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(srv.Handler())
	defer api.Close()
	from, to := now.Add(-time.Hour).UTC().Format(time.RFC3339), now.Add(time.Hour).UTC().Format(time.RFC3339)
	get := func(query string) (out struct {
		Series []struct {
			Region *string `json:"region"`
			usage.Counts
		} `json:"series"`
		Totals usage.Counts `json:"totals"`
	}) {
		t.Helper()
		req, _ := http.NewRequest("GET", api.URL+"/v1/usage?key=acct_world&window=minute&from="+from+"&to="+to+query, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/usage%s: %d %s", query, resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	var sum usage.Counts
	for _, c := range world {
		sum.Requests, sum.Allowed, sum.Rejected, sum.Cost, sum.Warnings = sum.Requests+c.Requests, sum.Allowed+c.Allowed, sum.Rejected+c.Rejected, sum.Cost+c.Cost, sum.Warnings+c.Warnings
	}
	if got := get(""); got.Totals != sum {
		t.Fatalf("usage summed over regions: %+v, want %+v", got.Totals, sum)
	}
	byRegion := get("&group_by=region")
	if byRegion.Totals != sum {
		t.Fatalf("group_by=region totals: %+v, want %+v", byRegion.Totals, sum)
	}
	got := map[string]usage.Counts{}
	for _, p := range byRegion.Series {
		if p.Region == nil {
			t.Fatal("a point of group_by=region without region")
		}
		c := got[*p.Region]
		c.Requests, c.Allowed, c.Rejected, c.Cost, c.Warnings = c.Requests+p.Requests, c.Allowed+p.Allowed, c.Rejected+p.Rejected, c.Cost+p.Cost, c.Warnings+p.Warnings
		got[*p.Region] = c
	}
	if fmt.Sprint(got) != fmt.Sprint(world) {
		t.Fatalf("group_by=region: %v, want %v", got, world)
	}

	// One soft-limit webhook for the global key, however many regions
	// warned; none for the regional key, which never warned.
	deadline = time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		mu.Lock()
		n := len(hooks)
		mu.Unlock()
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no soft-limit webhook within 60 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Wait until the notifier has decided every warning (sent, suppressed
	// by the cool-down, ...), so that a second webhook would have shown.
	var warnings int
	for _, ev := range all {
		if ev.Warning {
			warnings++
		}
	}
	deadline = time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		decided := sumCounter(t, nreg, "notifier_notifications_total") // every warning event, by decision
		if decided >= float64(warnings) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the notifier decided %v of %d warnings within 60 s", decided, warnings)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hooks) != 1 {
		t.Fatalf("%d soft-limit webhooks, want 1: %v", len(hooks), hooks)
	}
	if data, _ := hooks[0]["data"].(map[string]any); data == nil || data["key"] != "acct_world" {
		t.Fatalf("webhook: %v", hooks[0])
	}
}

func sumCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
