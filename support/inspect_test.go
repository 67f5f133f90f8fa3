package support_test

import (
	"context"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const faultPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, burst: 5 }
  gold: { rate: 1, burst: 10 }
keys: { acct_vip: gold }
rules:
  - { name: gold-api, tier: gold, scope: api, rate: 2, burst: 50 }
`

// TestInspectMarksWhatItCannotRead: with every part readable, inspect
// shows the rule (an override, explained), the bucket, a limiter's view
// and the recorded decisions; then with Redis stopped, a limiter gone and
// ClickHouse frozen (SIGSTOP) it still answers within its deadlines, each
// of those parts marked with its error.
func TestInspectMarksWhatItCannotRead(t *testing.T) {
	r := testenv.StartRedis(t)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx := context.Background()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".decisions_raw (event_id, ts, event_time, key, scope, allowed, source, remaining, policy, instance)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := b.Append("e1", uint64(now.UnixMilli()), now.UTC(), "acct_vip", "api", uint8(0), "local", int64(0), "override", "limiter-0"); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	wb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".webhook_deliveries (delivery_id, attempt, key, scope, url, attempted_at, attempted_ms, status_code, outcome)")
	if err != nil {
		t.Fatal(err)
	}
	if err := wb.Append("d1", uint16(1), "acct_vip", "api", "https://hooks.example/rl", now.UTC(), uint64(now.UnixMilli()), uint16(200), "delivered"); err != nil {
		t.Fatal(err)
	}
	if err := wb.Send(); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(dir+"/policy.yaml", []byte(faultPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(dir + "/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer rdb.Close()
	store := redisstore.New(rdb, "rl")
	lim, err := enforcement.New(enforcement.Config{Authority: store, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Check(ctx, enforcement.Request{Key: "acct_vip", Scope: "api", Cost: 3, HasCost: true}); err != nil || !d.Allowed {
		t.Fatalf("check: %+v %v", d, err)
	}
	live := httptest.NewServer(support.LocalHandler(support.Local{Limiter: lim, Instance: "limiter-0"}))
	defer live.Close()
	gone := httptest.NewServer(nil)
	gone.Close()

	in := &support.Inspector{Limiters: []string{live.URL, gone.URL}, Store: store, ClickHouse: conn, Database: db, Timeout: 2 * time.Second}
	rep := in.Inspect(ctx, "acct_vip", "api")
	if rep.Rule.Rule == nil || rep.Rule.Limit.Burst != 50 || rep.Rule.Explain == "" {
		t.Fatalf("rule: %+v; want the rule gold-api's burst 50, explained", rep.Rule)
	}
	if rep.Bucket.BucketView == nil || rep.Bucket.Tokens < 47 || rep.Bucket.Tokens > 48 || rep.Bucket.Capacity != 50 {
		t.Fatalf("bucket: %+v %q; want about 47 of 50", rep.Bucket.BucketView, rep.Bucket.Error)
	}
	if l := rep.Limiters[0]; l.Error != "" || !l.View.Held || !l.View.StoreKnown {
		t.Fatalf("live limiter: %+v %q", l.LocalAnswer, l.Error)
	}
	if rep.Limiters[1].Error == "" {
		t.Fatal("the gone limiter is not marked")
	}
	if rep.Decisions.Error != "" || len(rep.Decisions.Rows) != 1 || rep.Decisions.Rows[0].Source != "local" {
		t.Fatalf("decisions: %+v", rep.Decisions)
	}
	if rep.Webhooks.Error != "" || len(rep.Webhooks.Rows) != 1 || rep.Webhooks.Rows[0].StatusCode != 200 {
		t.Fatalf("webhooks: %+v", rep.Webhooks)
	}

	// Now the faults.
	r.Process().Kill()
	if err := ch.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Process().Signal(syscall.SIGCONT) })
	in.Timeout = 500 * time.Millisecond
	began := time.Now()
	rep = in.Inspect(ctx, "acct_vip", "api")
	took := time.Since(began)
	if rep.Rule.Rule == nil {
		t.Fatalf("rule lost: %+v", rep.Rule)
	}
	if rep.Bucket.Error == "" || rep.Debt.Error == "" || rep.ResetsError == "" {
		t.Fatalf("Redis stopped: bucket %q, debt %q, resets %q; want each marked", rep.Bucket.Error, rep.Debt.Error, rep.ResetsError)
	}
	if rep.Decisions.Error == "" || rep.Webhooks.Error == "" {
		t.Fatal("ClickHouse frozen: decisions or webhooks not marked")
	}
	if rep.Limiters[1].Error == "" || rep.Limiters[0].Error != "" {
		t.Fatalf("limiters: %+v", rep.Limiters)
	}
	t.Logf("inspect with Redis stopped, a limiter gone and ClickHouse frozen answered in %v (part deadline %v)", took, in.Timeout)
}
