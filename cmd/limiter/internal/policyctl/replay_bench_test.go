package policyctl

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkReplayFromClickHouse is `limiter policy replay` end to end:
// 1,000,000 recorded decisions (10,000 keys, 3 scopes, one hour) in a real
// clickhouse-server's decisions_raw, streamed and replayed under a
// candidate. It reports decisions replayed per second (wall time of the
// whole replay: queries, transfer, decoding, resolution, bucket arithmetic).
func BenchmarkReplayFromClickHouse(b *testing.B) {
	ch := testenv.StartClickHouse(b)
	db := ch.Database(b)
	conn := ch.Conn(b)
	ctx := context.Background()
	if err := schema.Apply(ctx, conn, db); err != nil {
		b.Fatal(err)
	}
	const n = 1_000_000
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	scopes := []string{"api:read", "api:search", "web"}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".decisions_raw (event_id, ts, event_time, key, scope, tier, cost, allowed, source, remaining, limit_value, policy, dry_run, warning, instance, kafka_partition, kafka_offset)")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		ts := start.Add(time.Duration(int64(i) * int64(time.Hour) / n))
		if err := batch.Append(fmt.Sprintf("e%d", i), uint64(ts.UnixMilli()), ts.Truncate(time.Second),
			fmt.Sprintf("acct_%d", (i*7919)%10000), scopes[i%3], "free", uint64(1), uint8(1), "shared",
			int64(0), int64(20), "free", uint8(0), uint8(0), "lim-1", uint32(i%4), uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "candidate.yaml")
	if err := os.WriteFile(file, []byte(`
version: 1
default_tier: free
tiers:
  free: { rate: 0.05, burst: 20 }
rules:
  - { name: search, scope: "api:search", rate: 0.02, burst: 10 }
`), 0o644); err != nil {
		b.Fatal(err)
	}
	env := map[string]string{"CLICKHOUSE_ADDR": ch.Addr(), "CLICKHOUSE_DATABASE": db}
	a := replayArgs{file: file, from: start, to: start.Add(time.Hour), sample: 1, top: 10, tolerance: 10 * time.Millisecond,
		window: 10 * time.Minute, queryTimeout: time.Minute, ch: chconn.FromEnv(envconfig.New(func(k string) string { return env[k] }), schema.ValidDatabase)}
	for _, sample := range []float64{1, 0.1} {
		b.Run(fmt.Sprintf("sample=%v", sample), func(b *testing.B) {
			a.sample = sample
			var rows int64
			var secs float64
			cpu0 := proccpu.Self()
			for i := 0; i < b.N; i++ {
				out, err := runReplay(ctx, a)
				if err != nil {
					b.Fatal(err)
				}
				rows += out.Rows
				secs += out.Seconds
			}
			// The replay's own CPU (this process: decoding, resolution,
			// buckets), apart from ClickHouse's and from machine load.
			b.ReportMetric(float64(rows)/(proccpu.Self()-cpu0).Seconds(), "rows/cpu-s")
			b.ReportMetric(float64(rows)/secs, "rows/s")
			b.ReportMetric(float64(rows)/float64(b.N), "rows/op")
		})
	}
}
