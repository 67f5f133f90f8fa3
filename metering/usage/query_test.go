package usage

import (
	"reflect"
	"testing"
	"time"
)

func TestQuerySQL(t *testing.T) {
	from := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(24 * time.Hour)
	for _, tc := range []struct {
		name string
		q    interface{ toSQL() (string, []any) }
		sql  string
		args []any
	}{
		{"usage by scope", usageQuery{db: "rl", table: "usage_hour", key: "k", byScope: true, from: from, to: to, limit: 5001},
			"SELECT toUInt32(start) AS b, scope, sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost, sum(warnings) AS n_warn FROM rl.usage_hour WHERE key = ? AND start >= toDateTime(?) AND start < toDateTime(?) GROUP BY b, scope ORDER BY b, scope LIMIT 5001",
			[]any{"k", from.Unix(), to.Unix()}},
		{"usage rebinned, one scope", usageQuery{db: "rl", table: "usage_minute", rebin: "toStartOfDay", tz: "Asia/Kolkata", key: "k", scope: "s", from: from, to: to, limit: 10},
			"SELECT toUInt32(toStartOfDay(start, ?)) AS b, sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost, sum(warnings) AS n_warn FROM rl.usage_minute WHERE key = ? AND scope = ? AND start >= toDateTime(?) AND start < toDateTime(?) GROUP BY b ORDER BY b LIMIT 10",
			[]any{"Asia/Kolkata", "k", "s", from.Unix(), to.Unix()}},
		{"usage by region", usageQuery{db: "rl", table: "usage_day", key: "k", byRegion: true, from: from, to: to, limit: 5001},
			"SELECT toUInt32(start) AS b, region, sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost, sum(warnings) AS n_warn FROM rl.usage_region_day WHERE key = ? AND start >= toDateTime(?) AND start < toDateTime(?) GROUP BY b, region ORDER BY b, region LIMIT 5001",
			[]any{"k", from.Unix(), to.Unix()}},
		{"usage by scope and region, rebinned", usageQuery{db: "rl", table: "usage_hour", rebin: "toStartOfDay", tz: "Europe/Paris", key: "k", byScope: true, byRegion: true, from: from, to: to, limit: 7},
			"SELECT toUInt32(toStartOfDay(start, ?)) AS b, scope, region, sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost, sum(warnings) AS n_warn FROM rl.usage_region_hour WHERE key = ? AND start >= toDateTime(?) AND start < toDateTime(?) GROUP BY b, scope, region ORDER BY b, scope, region LIMIT 7",
			[]any{"Europe/Paris", "k", from.Unix(), to.Unix()}},
		{"top keys", topKeysQuery{db: "rl", table: "usage_day", from: from, to: to, limit: 3},
			"SELECT key, sum(requests) AS n_req, sum(allowed) AS n_ok, sum(rejected) AS n_rej, sum(cost) AS n_cost FROM rl.usage_day WHERE start >= toDateTime(?) AND start < toDateTime(?) AND key != '' GROUP BY key ORDER BY n_req DESC, key LIMIT 3",
			[]any{from.Unix(), to.Unix()}},
		{"deliveries", deliveriesQuery{db: "rl", key: "k", limit: 5},
			"SELECT delivery_id, attempt, key, scope, tier, url, event_id, attempted_ms, status_code, error, duration_ms, outcome FROM rl.webhook_deliveries WHERE key = ? ORDER BY attempted_ms DESC, delivery_id, attempt DESC LIMIT 5",
			[]any{"k"}},
	} {
		sql, args := tc.q.toSQL()
		if sql != tc.sql || !reflect.DeepEqual(args, tc.args) {
			t.Errorf("%s:\n got %s %v\nwant %s %v", tc.name, sql, args, tc.sql, tc.args)
		}
	}
}
