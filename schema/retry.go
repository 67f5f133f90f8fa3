package schema

import (
	"context"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ApplyUntilDone applies the migrations, retrying with backoff (200 ms
// doubling to 2 s) while ClickHouse is unreachable, until it succeeds or ctx
// ends. It reports whether the schema is in place. Binaries run it in the
// background so that they start (and report not ready) while ClickHouse is down.
func ApplyUntilDone(ctx context.Context, conn driver.Conn, database string, log *slog.Logger) bool {
	return untilDone(ctx, conn, database, log, 30*time.Second, func(ctx context.Context) error { return Apply(ctx, conn, database) })
}

// ApplyClusterUntilDone is ApplyUntilDone for cluster mode: ApplyCluster on
// every node (nodes), retried until it succeeds on all of them.
func ApplyClusterUntilDone(ctx context.Context, nodes []driver.Conn, database, cluster string, log *slog.Logger) bool {
	if len(nodes) == 0 {
		log.Error("schema: cluster mode without nodes", "cluster", cluster)
		return false
	}
	// 30 s per node: a replicated CREATE waits for ZooKeeper.
	return untilDone(ctx, nodes[0], database, log.With("cluster", cluster, "nodes", len(nodes)), time.Duration(len(nodes))*30*time.Second, func(ctx context.Context) error {
		return ApplyCluster(ctx, nodes, database, cluster)
	})
}

func untilDone(ctx context.Context, conn driver.Conn, database string, log *slog.Logger, timeout time.Duration, apply func(context.Context) error) bool {
	backoff := 200 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, timeout)
		err := apply(actx)
		cancel()
		if err == nil {
			v, _ := Version(ctx, conn, database)
			log.Info("schema applied", "database", database, "version", v)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		log.Warn("schema not applied yet; retrying", "database", database, "err", err, "backoff", backoff.String())
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}
