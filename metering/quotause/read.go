package quotause

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
)

// Reader reads Rows from the rollups of one ClickHouse database: the day and
// month sums from usage_day, the hour sum from usage_hour (both UTC-aligned,
// like the quota windows). Every value is a bound argument; only the
// database name, validated once, is SQL text.
type Reader struct {
	conn driver.Conn
	db   string
}

// NewReader returns a Reader of database db over conn.
func NewReader(conn driver.Conn, db string) (*Reader, error) {
	if conn == nil {
		return nil, errors.New("quotause: nil ClickHouse connection")
	}
	if !schema.ValidDatabase(db) {
		return nil, fmt.Errorf("quotause: invalid database name %q", db)
	}
	return &Reader{conn: conn, db: db}, nil
}

type rowID struct{ key, scope, tier string }

// Rows returns, for every (key, scope, tier) with allowed cost recorded in
// the UTC month that contains now, its allowed cost in the current hour, day
// and month. key != "" restricts the read to that key (the usage API);
// key == "" reads every key (the reconciler: one row per active (key,
// scope, tier) of the month, held in memory for one pass). ctx bounds the
// reads.
func (r *Reader) Rows(ctx context.Context, now time.Time, key string) ([]Row, error) {
	return r.rows(ctx, now, key, schema.UsageDay, schema.UsageHour, "")
}

// RegionRows is Rows of the usage that the limiters of one region decided
// (usage_region_day and usage_region_hour, region = region): what that
// region's quota counters of regional limits spent. region must not be
// empty (usage recorded without a region is in Rows only).
func (r *Reader) RegionRows(ctx context.Context, now time.Time, key, region string) ([]Row, error) {
	if region == "" {
		return nil, errors.New("quotause: RegionRows needs a region")
	}
	return r.rows(ctx, now, key, schema.UsageRegionDay, schema.UsageRegionHour, region)
}

func (r *Reader) rows(ctx context.Context, now time.Time, key, dayTable, hourTable, region string) ([]Row, error) {
	now = now.UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	hour := now.Truncate(time.Hour)

	filter, args := "", []any{}
	if key != "" {
		filter, args = " AND key = ?", []any{key}
	}
	if region != "" {
		filter, args = filter+" AND region = ?", append(args, region)
	}
	byID := map[rowID]int{}
	var out []Row

	// Rows with key = '' are the consumer's progress markers; their
	// counters are 0 but they are not customers.
	q := fmt.Sprintf("SELECT key, scope, tier, sumIf(cost, start >= toDateTime(?)) AS day_cost, sum(cost) AS month_cost"+
		" FROM %s.%s WHERE start >= toDateTime(?) AND start < toDateTime(?) AND key != ''%s"+
		" GROUP BY key, scope, tier", r.db, dayTable, filter)
	rows, err := r.conn.Query(ctx, q, append([]any{day.Unix(), month.Unix(), month.AddDate(0, 1, 0).Unix()}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("read %s of %s for quotas: %w", dayTable, r.db, err)
	}
	for rows.Next() {
		var x Row
		if err := rows.Scan(&x.Key, &x.Scope, &x.Tier, &x.Day, &x.Month); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan %s of %s: %w", dayTable, r.db, err)
		}
		byID[rowID{x.Key, x.Scope, x.Tier}] = len(out)
		out = append(out, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s of %s for quotas: %w", dayTable, r.db, err)
	}

	q = fmt.Sprintf("SELECT key, scope, tier, sum(cost) AS hour_cost"+
		" FROM %s.%s WHERE start = toDateTime(?) AND key != ''%s"+
		" GROUP BY key, scope, tier", r.db, hourTable, filter)
	rows, err = r.conn.Query(ctx, q, append([]any{hour.Unix()}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("read %s of %s for quotas: %w", hourTable, r.db, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id rowID
		var cost uint64
		if err := rows.Scan(&id.key, &id.scope, &id.tier, &cost); err != nil {
			return nil, fmt.Errorf("scan %s of %s: %w", hourTable, r.db, err)
		}
		i, ok := byID[id]
		if !ok {
			// Each table has its own progress: the hour rollup may be a
			// batch ahead of the day rollup.
			i = len(out)
			byID[id] = i
			out = append(out, Row{Key: id.key, Scope: id.scope, Tier: id.tier})
		}
		out[i].Hour = cost
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s of %s for quotas: %w", hourTable, r.db, err)
	}
	return out, nil
}
