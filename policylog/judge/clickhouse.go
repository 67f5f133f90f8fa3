package judge

import (
	"context"
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
)

// ClickHouse counts a rollout's shadow verdicts in rollout_shadow
// (schema/0056), the meter-consumer's rollup.
type ClickHouse struct {
	Conn     driver.Conn
	Database string // a validated identifier (schema.ValidDatabase)
}

var _ Counter = ClickHouse{}

// countQuery is the rollup's sums for one rollout: rows with rollout = 0
// are markers, never matched; ORDER BY (rollout, ...) makes it a range
// read.
type countQuery struct {
	database string
	rollout  int64
}

func (q countQuery) toSQL() (string, []any) {
	return "SELECT sum(decisions), sum(newly_rejected) FROM " + q.database + "." + schema.RolloutShadow + " WHERE rollout = ?", []any{q.rollout}
}

// Count implements Counter.
func (c ClickHouse) Count(ctx context.Context, rollout int64) (uint64, uint64, error) {
	if !schema.ValidDatabase(c.Database) {
		return 0, 0, fmt.Errorf("judge: invalid database name %q", c.Database)
	}
	sql, args := countQuery{c.Database, rollout}.toSQL()
	var decisions, newly uint64
	if err := c.Conn.QueryRow(ctx, sql, args...).Scan(&decisions, &newly); err != nil {
		return 0, 0, fmt.Errorf("rollout_shadow of rollout %d: %w", rollout, err)
	}
	return decisions, newly, nil
}
