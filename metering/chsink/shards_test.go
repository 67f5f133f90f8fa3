package chsink_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/metering/rawscan"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestShardOf(t *testing.T) {
	for p, want := range []int{0, 1, 0, 1, 0} {
		if got := chsink.ShardOf(p, 2); got != want {
			t.Errorf("ShardOf(%d, 2) = %d, want %d", p, got, want)
		}
	}
}

// clusterSink migrates a fresh database on the shared 2 × 2 cluster and
// returns the sharded sink over it and a sum over a Distributed table.
func clusterSink(t *testing.T) (*testenv.ClickHouseCluster, string, *chsink.Sharded) {
	t.Helper()
	c := cluster.Get(t)
	db := c.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := schema.ApplyCluster(ctx, c.ShardConns(t), db, c.Name); err != nil {
		t.Fatal(err)
	}
	var conns [][]driver.Conn
	for _, shard := range c.Shards {
		var rs []driver.Conn
		for _, n := range shard {
			rs = append(rs, n.Conn(t))
		}
		conns = append(conns, rs)
	}
	s, err := chsink.NewSharded(conns, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, db, s
}

func query(t *testing.T, n *testenv.ClickHouse, q string) string {
	t.Helper()
	conn, err := n.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s on %s: %v", q, n.Addr(), err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v uint64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(v))
	}
	return strings.Join(out, ",")
}

func waitQuery(t *testing.T, n *testenv.ClickHouse, q, want, what string) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		got := query(t, n, q)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s on %s = %s after 60 s, want %s", what, q, n.Addr(), got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Each partition's rows land on its shard only (both replicas), and the
// Distributed tables read every shard once.
func TestShardedWritesEachPartitionToItsShard(t *testing.T) {
	c, db, s := clusterSink(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 0, 0, 0, 0, time.UTC)
	for part := 0; part < 4; part++ {
		p, err := s.Progress(ctx, part)
		if err != nil {
			t.Fatal(err)
		}
		if p.Resume() != 0 {
			t.Fatalf("partition %d resumes at %d on empty tables", part, p.Resume())
		}
		if err := s.Write(ctx, part, records(0, 100+part, base), int64(99+part), &p); err != nil {
			t.Fatal(err)
		}
	}
	for i, shard := range c.Shards {
		want := "0,2"
		if i == 1 {
			want = "1,3"
		}
		for j, n := range shard {
			for _, table := range []string{"decisions_raw_local", "usage_minute_local", "usage_hour_local", "usage_day_local"} {
				where := " WHERE key = ''" // the rollups' markers carry the partition
				if table == "decisions_raw_local" {
					where = ""
				}
				waitQuery(t, n, "SELECT DISTINCT toUInt64(kafka_partition) AS p FROM "+db+"."+table+where+" ORDER BY p",
					want, fmt.Sprintf("partitions of shard %d replica %d in %s", i+1, j+1, table))
			}
		}
	}
	for _, n := range c.Nodes() {
		waitQuery(t, n, "SELECT count() FROM "+db+".decisions_raw", "406", "rows through the Distributed decisions_raw")
		for _, table := range testenv.RollupTables() {
			waitQuery(t, n, "SELECT sum(requests) FROM "+db+"."+table+" WHERE key != ''", "406", "requests through the Distributed "+table)
		}
	}
}

// A replica that lacks the newest part of its shard (its sibling wrote it
// and died before the copy) never answers Progress: the partition waits
// until the part can be fetched, then resumes after it. A replica that is
// down while its sibling has everything costs nothing: the sibling answers.
func TestShardedProgressWaitsForAPartOnlyADeadReplicaHas(t *testing.T) {
	c, db, s := clusterSink(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 0, 0, 0, 0, time.UTC)
	r1, r2 := c.Shards[0][0], c.Shards[0][1]
	t.Cleanup(func() { // the shared cluster must be whole for the next test
		_ = r2.Process().Signal(syscall.SIGCONT)
		if r1.Process() == nil || r1.Process().Exited() {
			if err := r1.Start(); err != nil {
				t.Errorf("restart replica 1 of shard 1: %v", err)
			}
		}
	})

	p, err := s.Progress(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 0, records(0, 100, base), 99, &p); err != nil {
		t.Fatal(err)
	}
	waitQuery(t, r2, "SELECT count() FROM "+db+".decisions_raw_local", "100", "replica 2 copies the first batch")

	// Replica 2 paused: the second batch is on replica 1 only, which dies.
	if err := r2.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 0, records(100, 100, base), 199, &p); err != nil {
		t.Fatal(err)
	}
	r1.Process().Kill()
	if err := r2.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Replica 2 alone would say "resume at 100" and count 100..199 twice.
	for i := 0; i < 2; i++ {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := s.Progress(pctx, 0)
		cancel()
		if err == nil {
			t.Fatalf("Progress answered %v (resume at %d) from a replica lacking offsets 100..199", got, got.Resume())
		}
		t.Logf("progress refused, as it must be: %v", err)
	}

	// Replica 1 back: replica 2 fetches the part, and Progress is right.
	if err := r1.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Timeout(90 * time.Second))
	for {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		got, err := s.Progress(pctx, 0)
		cancel()
		if err == nil {
			if got.Resume() != 200 {
				t.Fatalf("progress after replica 1 came back resumes at %d, want 200", got.Resume())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress 90 s after replica 1 came back: %v", err)
		}
		time.Sleep(time.Second)
	}

	// Replica 1 stopped after everything is copied: replica 2 answers at
	// once and takes the writes.
	waitQuery(t, r2, "SELECT count() FROM "+db+".decisions_raw_local", "200", "replica 2 copies the second batch")
	// Every table's parts, not only the raw table's.
	waitQuery(t, r2, "SELECT count() FROM system.replication_queue WHERE database = '"+db+"'", "0", "replica 2 copies every part of the second batch")
	r1.Stop()
	p, err = s.Progress(ctx, 0)
	if err != nil {
		t.Fatalf("progress with replica 1 stopped and nothing missing on replica 2: %v", err)
	}
	if p.Resume() != 200 {
		t.Fatalf("resume at %d, want 200", p.Resume())
	}
	if err := s.Write(ctx, 0, records(200, 50, base), 249, &p); err != nil {
		t.Fatal(err)
	}
	if err := r1.Start(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testenv.ClickHouse{r1, r2} {
		waitQuery(t, n, "SELECT count() FROM "+db+".decisions_raw_local", "250", "every batch once on each replica")
		for _, table := range []string{"usage_minute_local", "usage_hour_local", "usage_day_local"} {
			waitQuery(t, n, "SELECT sum(requests) FROM "+db+"."+table+" WHERE key != ''", "250", "every event counted once in "+table)
		}
	}
}

// The readers that keep their table names in cluster mode — the quota
// reconciler's quotause.Reader and rawscan (limiter policy replay) — read
// the same from the Distributed tables of a cluster as from one server
// holding the same batches.
func TestReadersSeeTheSameThroughTheDistributedTables(t *testing.T) {
	c, clusterDB, sharded := clusterSink(t)
	single, oneConn, oneDB := setupDB(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	for part := 0; part < 4; part++ {
		recs := records(part*10_000, 3000, base)
		last := recs[len(recs)-1].Offset
		for _, s := range []interface {
			Progress(context.Context, int) (chsink.Progress, error)
			Write(context.Context, int, []chsink.Record, int64, *chsink.Progress) error
		}{single, sharded} {
			p, err := s.Progress(ctx, part)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Write(ctx, part, recs, last, &p); err != nil {
				t.Fatal(err)
			}
		}
	}
	clusterConn := c.Shards[1][1].Conn(t) // any node: a replica that must copy, too
	quota := func(conn driver.Conn, db string) string {
		r, err := quotause.NewReader(conn, db)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := r.Rows(ctx, base.Add(30*time.Minute), "")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range rows {
			out = append(out, fmt.Sprintf("%+v", x))
		}
		sort.Strings(out)
		return strings.Join(out, "\n")
	}
	scan := func(conn driver.Conn, db string) string {
		var b strings.Builder
		err := rawscan.Scan(ctx, conn, rawscan.Query{Database: db, From: base.Add(-time.Hour), To: base.Add(time.Hour)}, 10*time.Minute, 30*time.Second,
			func(r *rawscan.Row) error { fmt.Fprintf(&b, "%+v\n", *r); return nil })
		if err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	want := quota(oneConn, oneDB)
	if want == "" {
		t.Fatal("quotause read nothing from the single server")
	}
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for got := quota(clusterConn, clusterDB); got != want; got = quota(clusterConn, clusterDB) {
		if time.Now().After(deadline) {
			t.Fatalf("quotause through the Distributed tables:\n%.2000s\nwant (one server):\n%.2000s", got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wantScan := scan(oneConn, oneDB)
	if strings.Count(wantScan, "\n") != 12_000 {
		t.Fatalf("rawscan read %d rows from the single server, want 12000", strings.Count(wantScan, "\n"))
	}
	deadline = time.Now().Add(testenv.Timeout(60 * time.Second))
	for got := scan(clusterConn, clusterDB); got != wantScan; got = scan(clusterConn, clusterDB) {
		if time.Now().After(deadline) {
			t.Fatalf("rawscan through the Distributed decisions_raw differs from one server (%d vs %d rows)", strings.Count(got, "\n"), strings.Count(wantScan, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
