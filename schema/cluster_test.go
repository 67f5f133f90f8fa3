package schema_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestClusterStatementsOfACreate(t *testing.T) {
	got, err := schema.ClusterStatements("CREATE TABLE IF NOT EXISTS ${DB}.usage_minute (\n    key String\n) ENGINE = SummingMergeTree((requests, cost))\nORDER BY key", "ratewarden")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"CREATE TABLE IF NOT EXISTS ${DB}.usage_minute_local (\n    key String\n) ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/${DB}/usage_minute_local', '{replica}', (requests, cost))\nORDER BY key",
		"CREATE TABLE IF NOT EXISTS ${DB}.usage_minute AS ${DB}.usage_minute_local ENGINE = Distributed(ratewarden, ${DB}, usage_minute_local, rand())",
	}
	if strings.Join(got, "\n;\n") != strings.Join(want, "\n;\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n;\n"), strings.Join(want, "\n;\n"))
	}
	if _, err := schema.ClusterStatements("CREATE TABLE IF NOT EXISTS ${DB}.unknown (a UInt8) ENGINE = MergeTree() ORDER BY a", "ratewarden"); err == nil {
		t.Fatal("a table without a sharding key was accepted")
	}
	if _, err := schema.ClusterStatements("CREATE MATERIALIZED VIEW ${DB}.v TO ${DB}.t AS SELECT 1", "ratewarden"); err == nil {
		t.Fatal("a statement without a cluster form was accepted")
	}
	if _, err := schema.ClusterStatements("CREATE TABLE IF NOT EXISTS ${DB}.decisions_raw (a UInt8) ENGINE = MergeTree() ORDER BY a", "bad name"); err == nil {
		t.Fatal("an invalid cluster name was accepted")
	}
}

// nodeSnapshot is snapshot for one node of the cluster.
func nodeSnapshot(t *testing.T, n *testenv.ClickHouse, db string) string {
	t.Helper()
	return snapshotOn(t, n, db)
}

// Every node of the 2 × 2 cluster gets every table as a replicated local
// table and a Distributed table over them, and its own record of the
// versions; applying again (from two processes at once) changes nothing;
// a row written to one replica is copied to the other and read through the
// Distributed table of every node.
func TestApplyClusterOnEveryNode(t *testing.T) {
	c := cluster.Get(t)
	db := c.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := schema.ApplyCluster(ctx, c.ShardConns(t), db, c.Name); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	first := map[string]string{}
	for _, n := range c.Nodes() {
		s := nodeSnapshot(t, n, db)
		first[n.Addr()] = s
		for _, table := range []string{"decisions_raw", "usage_minute", "usage_hour", "usage_day", "portal_token_events", "webhook_deliveries"} {
			if !strings.Contains(s, table+" Distributed ") {
				t.Errorf("%s: %s is not a Distributed table:\n%s", n.Addr(), table, s)
			}
			if !strings.Contains(s, table+"_local Replicated") {
				t.Errorf("%s: %s_local is not replicated:\n%s", n.Addr(), table, s)
			}
		}
		conn := n.Conn(t)
		if v, err := schema.Version(ctx, conn, db); err != nil || v != schema.Latest() {
			t.Errorf("%s: recorded version %d (%v), want %d", n.Addr(), v, err, schema.Latest())
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = schema.ApplyCluster(ctx, c.ShardConns(t), db, c.Name) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("second apply: %v", err)
		}
	}
	for _, n := range c.Nodes() {
		if s := nodeSnapshot(t, n, db); s != first[n.Addr()] {
			t.Fatalf("%s: second apply changed the schema:\nbefore:\n%s\nafter:\n%s", n.Addr(), first[n.Addr()], s)
		}
	}

	// A row on shard 1, replica 1: copied to replica 2; every node's
	// Distributed table reads it once.
	conn := c.Shards[0][0].Conn(t)
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".usage_minute_local (key, scope, tier, start, requests, allowed, rejected, cost, warnings, batches, kafka_partition, kafka_offset)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append("k", "s", "free", time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC), uint64(2), uint64(1), uint64(1), uint64(5), uint64(0), uint64(0), uint32(0), uint64(0)); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		conn := n.Conn(t)
		deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
		for {
			var req uint64
			err := conn.QueryRow(ctx, "SELECT sum(requests) FROM "+db+".usage_minute WHERE key = 'k'").Scan(&req)
			if err == nil && req == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the Distributed usage_minute reads %d requests (err %v) after 60 s, want 2", n.Addr(), req, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var copies uint64
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		err := c.Shards[0][1].Conn(t).QueryRow(ctx, "SELECT count() FROM "+db+".usage_minute_local").Scan(&copies)
		if err == nil && copies == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica 2 of shard 1 holds %d rows (err %v) after 60 s, want the 1 written to replica 1", copies, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A replica that is down does not keep a binary from starting (a consumer
// must start while a replica is lost): ApplyCluster checks the rest and
// says which node it skipped; once the replica is back, applying again
// succeeds.
func TestApplyClusterSkipsAReplicaThatIsDown(t *testing.T) {
	c := cluster.Get(t)
	db := c.Database(t)
	down := c.Shards[1][1]
	conns := c.ShardConns(t) // opened while it is up: the harness pings at open
	ctx0, cancel0 := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel0()
	if err := schema.ApplyCluster(ctx0, conns, db, c.Name); err != nil {
		t.Fatal(err)
	}
	down.Stop()
	t.Cleanup(func() {
		if down.Process() == nil || down.Process().Exited() {
			if err := down.Start(); err != nil {
				t.Errorf("restart replica 2 of shard 2: %v", err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := schema.ApplyCluster(ctx, conns, db, c.Name)
	var inc *schema.Incomplete
	if !errors.As(err, &inc) || len(inc.Skipped) != 1 || !strings.Contains(inc.Skipped[0], "shard 2 replica 2") {
		t.Fatalf("ApplyCluster with a replica down: %v, want Incomplete naming shard 2 replica 2", err)
	}
	for _, n := range []*testenv.ClickHouse{c.Shards[0][0], c.Shards[0][1], c.Shards[1][0]} {
		if v, err := schema.Version(ctx, n.Conn(t), db); err != nil || v != schema.Latest() {
			t.Fatalf("%s: version %d (%v), want %d", n.Addr(), v, err, schema.Latest())
		}
	}
	if err := down.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		err := schema.ApplyCluster(ctx, c.ShardConns(t), db, c.Name)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ApplyCluster after the replica came back: %v", err)
		}
		time.Sleep(time.Second)
	}
	if v, err := schema.Version(ctx, down.Conn(t), db); err != nil || v != schema.Latest() {
		t.Fatalf("the replica that was down: version %d (%v), want %d", v, err, schema.Latest())
	}
	if s := nodeSnapshot(t, down, db); !strings.Contains(s, "decisions_raw Distributed ") || !strings.Contains(s, "shadow_rejected") {
		t.Fatalf("the replica that was down lacks tables or columns:\n%s", s)
	}
}
