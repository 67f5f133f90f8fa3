package support

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// recentQuery is the latest decisions of one key and scope in
// decisions_raw, newest first, within the last day. The table is ordered
// by Kafka position, not by key, so the day bound is what keeps the read
// small: it prunes every monthly partition but the current one or two.
type recentQuery struct {
	Database   string
	Key, Scope string
	Limit      int
}

func (q recentQuery) table() string {
	db := q.Database
	if db == "" {
		db = "ratelimit"
	}
	return db + ".decisions_raw"
}

func (q recentQuery) toSQL() (string, []any) {
	n := q.Limit
	if n <= 0 {
		n = 20
	}
	sql := fmt.Sprintf(`SELECT ts, kind, source, allowed, cost, remaining, policy, policy_revision, region, instance, trace_id
FROM %s
WHERE key = ? AND scope = ? AND event_time >= ?
ORDER BY ts DESC
LIMIT %d`, q.table(), n)
	return sql, []any{q.Key, q.Scope, time.Now().Add(-24 * time.Hour).UTC()}
}

func (q recentQuery) run(ctx context.Context, conn driver.Conn) ([]Decision, error) {
	sql, args := q.toSQL()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q.table(), err)
	}
	defer rows.Close()
	out := []Decision{}
	for rows.Next() {
		var d Decision
		var ts uint64
		var allowed uint8
		if err := rows.Scan(&ts, &d.Kind, &d.Source, &allowed, &d.Cost, &d.Remaining, &d.Policy, &d.PolicyRevision, &d.Region, &d.Instance, &d.TraceID); err != nil {
			return nil, fmt.Errorf("read %s: %w", q.table(), err)
		}
		d.Time, d.Allowed = time.UnixMilli(int64(ts)).UTC(), allowed == 1
		out = append(out, d)
	}
	return out, rows.Err()
}
