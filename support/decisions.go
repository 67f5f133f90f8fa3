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

// Webhook is one soft-limit webhook delivery attempt (webhook_deliveries).
type Webhook struct {
	Time       time.Time `json:"time"`
	Scope      string    `json:"scope"`
	URL        string    `json:"url"`
	Attempt    uint16    `json:"attempt"`
	StatusCode uint16    `json:"statusCode"`
	Outcome    string    `json:"outcome"`
	Error      string    `json:"error,omitempty"`
}

// webhookQuery is the latest soft-limit webhook attempts of one key (every
// scope: a warning is the key's), newest first, within the last day. The
// table is ordered by key, so the read is the key's rows only.
type webhookQuery struct {
	Database string
	Key      string
	Limit    int
}

func (q webhookQuery) table() string {
	db := q.Database
	if db == "" {
		db = "ratelimit"
	}
	return db + ".webhook_deliveries"
}

func (q webhookQuery) toSQL() (string, []any) {
	n := q.Limit
	if n <= 0 {
		n = 10
	}
	return fmt.Sprintf(`SELECT attempted_ms, scope, url, attempt, status_code, outcome, error
FROM %s
WHERE key = ? AND attempted_at >= ?
ORDER BY attempted_ms DESC
LIMIT %d`, q.table(), n), []any{q.Key, time.Now().Add(-24 * time.Hour).UTC()}
}

func (q webhookQuery) run(ctx context.Context, conn driver.Conn) ([]Webhook, error) {
	sql, args := q.toSQL()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q.table(), err)
	}
	defer rows.Close()
	out := []Webhook{}
	for rows.Next() {
		var w Webhook
		var ms uint64
		if err := rows.Scan(&ms, &w.Scope, &w.URL, &w.Attempt, &w.StatusCode, &w.Outcome, &w.Error); err != nil {
			return nil, fmt.Errorf("read %s: %w", q.table(), err)
		}
		w.Time = time.UnixMilli(int64(ms)).UTC()
		out = append(out, w)
	}
	return out, rows.Err()
}
