package usage

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/schema"
)

// Query builders: one small struct per query, rendered by toSQL into SQL text
// and bound arguments. Only constants of this file and the database name
// (validated at start by ValidDatabaseName) become SQL text; every value that
// comes from a request is a bound argument.

// usageQuery sums one rollup table into buckets.
type usageQuery struct {
	db      string
	table   string // usage_minute | usage_hour | usage_day
	rebin   string // "" (the rollup's own buckets), "toStartOfHour" or "toStartOfDay"
	tz      string // zone for rebin
	key     string
	scope   string // "" = all scopes
	byScope bool
	// byRegion reads the per-region twin of table, one row per region
	// that recorded any usage (events without a region are not there).
	byRegion bool
	from     time.Time // inclusive, bucket-aligned
	to       time.Time // exclusive, bucket-aligned
	limit    int       // rows; the caller asks for one more than it accepts
}

// planUsage picks the rollup that answers p: the one matching the window when
// its buckets line up with the window's in p.Loc, else a finer one re-bucketed
// in p.Loc. Day and hour rollups are UTC-aligned, so a day in Europe/Paris is
// summed from hour rows (toStartOfDay(start, tz)), and an hour or day in a
// zone with a half-hour offset (Asia/Kolkata) from minute rows. The raw table
// is never read.
func planUsage(db string, p UsageParams, key string) usageQuery {
	q := usageQuery{db: db, key: key, scope: p.Scope, byScope: p.GroupByScope, byRegion: p.GroupByRegion,
		from: p.From, to: p.To, limit: MaxPoints + 1, tz: p.Loc.String()}
	allZero, wholeHours := zoneOffsets(p.Loc, p.From, p.To)
	switch p.Window {
	case Minute:
		q.table = schema.UsageMinute
	case Hour:
		if wholeHours {
			q.table = schema.UsageHour
		} else {
			q.table, q.rebin = schema.UsageMinute, "toStartOfHour"
		}
	default:
		switch {
		case allZero:
			q.table = schema.UsageDay
		case wholeHours:
			q.table, q.rebin = schema.UsageHour, "toStartOfDay"
		default:
			q.table, q.rebin = schema.UsageMinute, "toStartOfDay"
		}
	}
	return q
}

func (q usageQuery) toSQL() (string, []any) {
	var b strings.Builder
	var args []any
	b.WriteString("SELECT ")
	if q.rebin != "" {
		b.WriteString("toUInt32(" + q.rebin + "(start, ?)) AS b")
		args = append(args, q.tz)
	} else {
		b.WriteString("toUInt32(start) AS b")
	}
	if q.byScope {
		b.WriteString(", scope")
	}
	table := q.table
	if q.byRegion {
		b.WriteString(", region")
		table = schema.RegionRollupOf(q.table)
	}
	b.WriteString(", sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost, sum(warnings) AS n_warn")
	fmt.Fprintf(&b, " FROM %s.%s WHERE key = ?", q.db, table)
	args = append(args, q.key)
	if q.scope != "" {
		b.WriteString(" AND scope = ?")
		args = append(args, q.scope)
	}
	// The rollups are ordered by (key, scope, start) or similar: key first
	// lets the primary index skip every other customer's rows.
	b.WriteString(" AND start >= toDateTime(?) AND start < toDateTime(?)")
	args = append(args, q.from.Unix(), q.to.Unix())
	group := "b"
	if q.byScope {
		group += ", scope"
	}
	if q.byRegion {
		group += ", region"
	}
	b.WriteString(" GROUP BY " + group + " ORDER BY " + group)
	fmt.Fprintf(&b, " LIMIT %d", q.limit)
	return b.String(), args
}

// topKeysQuery ranks keys by requests in [from, to).
type topKeysQuery struct {
	db       string
	table    string
	from, to time.Time
	limit    int
}

// planTopKeys reads the coarsest rollup whose buckets line up with from and to.
func planTopKeys(db string, p TopKeysParams) topKeysQuery {
	q := topKeysQuery{db: db, from: p.From, to: p.To, limit: p.Limit}
	switch {
	case aligned(p.From, 24*time.Hour) && aligned(p.To, 24*time.Hour):
		q.table = schema.UsageDay
	case aligned(p.From, time.Hour) && aligned(p.To, time.Hour):
		q.table = schema.UsageHour
	default:
		q.table = schema.UsageMinute
	}
	return q
}

func aligned(t time.Time, d time.Duration) bool { return t.Truncate(d).Equal(t) }

func (q topKeysQuery) toSQL() (string, []any) {
	// Ties in requests are broken by key so that pages are stable. Rows with
	// key = '' are the meter-consumer's progress markers, not customers.
	s := fmt.Sprintf("SELECT key, sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost"+
		" FROM %s.%s WHERE start >= toDateTime(?) AND start < toDateTime(?) AND key != ''"+
		" GROUP BY key ORDER BY n_req DESC, key LIMIT %d", q.db, q.table, q.limit)
	return s, []any{q.from.Unix(), q.to.Unix()}
}

// totalsQuery sums one key's rollup rows in [from, to), across scopes.
type totalsQuery struct {
	db       string
	table    string
	key      string
	from, to time.Time
}

func (q totalsQuery) toSQL() (string, []any) {
	s := fmt.Sprintf("SELECT sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost, sum(warnings) AS n_warn"+
		" FROM %s.%s WHERE key = ? AND start >= toDateTime(?) AND start < toDateTime(?)", q.db, q.table)
	return s, []any{q.key, q.from.Unix(), q.to.Unix()}
}

// deliveriesQuery lists webhook delivery attempts, newest first.
type deliveriesQuery struct {
	db         string
	key        string // "" = all keys
	deliveryID string // "" = all deliveries
	limit      int
}

func (q deliveriesQuery) toSQL() (string, []any) {
	var b strings.Builder
	var args []any
	fmt.Fprintf(&b, "SELECT delivery_id, attempt, key, scope, tier, url, event_id, attempted_ms, status_code, error, duration_ms, outcome FROM %s.%s", q.db, schema.WebhookDeliveries)
	var conds []string
	if q.key != "" {
		conds = append(conds, "key = ?")
		args = append(args, q.key)
	}
	if q.deliveryID != "" {
		conds = append(conds, "delivery_id = ?")
		args = append(args, q.deliveryID)
	}
	if len(conds) > 0 {
		b.WriteString(" WHERE " + strings.Join(conds, " AND "))
	}
	fmt.Fprintf(&b, " ORDER BY attempted_ms DESC, delivery_id, attempt DESC LIMIT %d", q.limit)
	return b.String(), args
}
