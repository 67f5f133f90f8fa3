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
	backoff := 200 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := Apply(actx, conn, database)
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
