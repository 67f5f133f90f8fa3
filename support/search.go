package support

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Found is one (key, scope) a search found, with its last day's traffic.
type Found struct {
	Key      string    `json:"key"`
	Scope    string    `json:"scope"`
	Requests uint64    `json:"requests"`
	Rejected uint64    `json:"rejected"`
	Last     time.Time `json:"last"`
}

// searchQuery is the keys beginning with Prefix that made a decision in
// the last day, by scope, the busiest first: what the support page lists
// for "find a key". The store has no index of keys (a bucket lives only
// while it is refilling), so the record of decisions is where a key is
// found. The day bound prunes every monthly partition but the current
// one or two, as recentQuery's does.
type searchQuery struct {
	Database string
	Prefix   string
	Limit    int
}

func (q searchQuery) table() string {
	return recentQuery{Database: q.Database}.table()
}

// likePrefix escapes LIKE's wildcards (and its escape) in p and appends
// one %: p is matched literally, as a prefix.
func likePrefix(p string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(p) + "%"
}

func (q searchQuery) toSQL() (string, []any) {
	n := q.Limit
	if n <= 0 {
		n = 20
	}
	return fmt.Sprintf(`SELECT key, scope, count() AS requests, countIf(allowed = 0) AS rejected, max(ts) AS last
FROM %s
WHERE event_time >= ? AND key LIKE ? AND kind = 'decision'
GROUP BY key, scope
ORDER BY requests DESC, key, scope
LIMIT %d`, q.table(), n), []any{time.Now().Add(-24 * time.Hour).UTC(), likePrefix(q.Prefix)}
}

func (q searchQuery) run(ctx context.Context, conn driver.Conn) ([]Found, error) {
	sql, args := q.toSQL()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q.table(), err)
	}
	defer rows.Close()
	out := []Found{}
	for rows.Next() {
		var f Found
		var last uint64
		if err := rows.Scan(&f.Key, &f.Scope, &f.Requests, &f.Rejected, &last); err != nil {
			return nil, fmt.Errorf("read %s: %w", q.table(), err)
		}
		f.Last = time.UnixMilli(int64(last)).UTC()
		out = append(out, f)
	}
	return out, rows.Err()
}

// Search lists the keys beginning with prefix that made decisions in the
// last day (each with its scopes), the busiest first, within the part
// timeout.
func (in *Inspector) Search(ctx context.Context, prefix string, limit int) ([]Found, error) {
	if in.ClickHouse == nil {
		return nil, fmt.Errorf("ClickHouse is not configured here (CLICKHOUSE_ADDR): keys are found in the record of decisions")
	}
	ctx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	return searchQuery{Database: in.Database, Prefix: prefix, Limit: limit}.run(ctx, in.ClickHouse)
}
