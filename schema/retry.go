package schema

import (
	"context"
	"errors"
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

// ApplyClusterUntilDone is ApplyUntilDone for cluster mode: ApplyCluster,
// retried until every node is migrated. usable (may be nil) is called once,
// as soon as every shard has a migrated replica — possibly before the
// return, while a replica that is down waits for its turn.
func ApplyClusterUntilDone(ctx context.Context, shards [][]driver.Conn, database, cluster string, log *slog.Logger, usable func()) bool {
	if len(shards) == 0 || len(shards[0]) == 0 {
		log.Error("schema: cluster mode without nodes", "cluster", cluster)
		return false
	}
	nodes := 0
	for _, s := range shards {
		nodes += len(s)
	}
	told := false
	tell := func() {
		if !told && usable != nil {
			told = true
			usable()
		}
	}
	// 30 s per node: a replicated CREATE waits for ZooKeeper.
	done := untilDone(ctx, shards[0][0], database, log.With("cluster", cluster, "nodes", nodes), time.Duration(nodes)*30*time.Second, func(ctx context.Context) error {
		err := ApplyCluster(ctx, shards, database, cluster)
		var inc *Incomplete
		if errors.As(err, &inc) {
			tell()
		}
		return err
	})
	if done {
		tell()
	}
	return done
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
		// A replica that is down (Incomplete: the schema is usable) is
		// retried less often than a ClickHouse that is not there at all.
		limit := 2 * time.Second
		var inc *Incomplete
		if errors.As(err, &inc) {
			limit = 30 * time.Second
		}
		backoff = min(backoff*2, limit)
	}
}
