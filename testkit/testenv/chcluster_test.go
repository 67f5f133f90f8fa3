package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestClickHouseCluster: the harness's 2 × 2 cluster replicates a
// ReplicatedMergeTree between the replicas of a shard (through ZooKeeper and
// the interserver port), and a Distributed table reads every shard once.
func TestClickHouseCluster(t *testing.T) {
	c := StartClickHouseCluster(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range c.Nodes() {
		conn := n.Conn(t)
		for _, q := range []string{
			"CREATE DATABASE IF NOT EXISTS h",
			"CREATE TABLE IF NOT EXISTS h.t_local (shard UInt32, v UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/h/t_local', '{replica}') ORDER BY v",
			"CREATE TABLE IF NOT EXISTS h.t AS h.t_local ENGINE = Distributed(" + c.Name + ", h, t_local, rand())",
		} {
			if err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s on %s: %v", q, n.Addr(), err)
			}
		}
	}
	// Each shard's first replica gets its own rows.
	for i, s := range c.Shards {
		conn := s[0].Conn(t)
		b, err := conn.PrepareBatch(ctx, "INSERT INTO h.t_local (shard, v)")
		if err != nil {
			t.Fatal(err)
		}
		for v := 0; v < 10*(i+1); v++ {
			if err := b.Append(uint32(i), uint64(v)); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	// The second replica of each shard gets a copy, eventually.
	for i, s := range c.Shards {
		conn := s[1].Conn(t)
		waitCount(t, fmt.Sprintf("replica 2 of shard %d copies its 10×%d rows", i+1, i+1), func() (uint64, error) {
			var n uint64
			err := conn.QueryRow(ctx, "SELECT count() FROM h.t_local").Scan(&n)
			return n, err
		}, uint64(10*(i+1)))
	}
	// Any node's Distributed table reads each shard once: 10 + 20 rows.
	for _, n := range c.Nodes() {
		conn := n.Conn(t)
		var got uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM h.t").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != 30 {
			t.Fatalf("distributed count on %s = %d, want 30", n.Addr(), got)
		}
	}
}

func waitCount(t *testing.T, what string, read func() (uint64, error), want uint64) {
	t.Helper()
	deadline := time.Now().Add(Timeout(60 * time.Second))
	for {
		got, err := read()
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after 60 s got %d (err %v), want %d", what, got, err, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
