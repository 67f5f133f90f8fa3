package testenv

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering"

	"github.com/ratewarden/ratewarden/schema"
)

// UsageKey names one series of the rollup tables.
type UsageKey struct{ Key, Scope string }

// UsageTotal is the sum of one series' counters over all time.
type UsageTotal struct{ Requests, Allowed, Rejected, Cost, Warnings uint64 }

// RollupTables are the tables WaitUsageTotals compares.
func RollupTables() []string { return schema.RollupTables() }

// UsageTotals reads the totals per key and scope from one rollup table of
// database (the consumer's markers, whose key is empty, excluded).
func UsageTotals(ctx context.Context, conn driver.Conn, database, table string) (map[UsageKey]UsageTotal, error) {
	rows, err := conn.Query(ctx, "SELECT key, scope, sum(requests), sum(allowed), sum(rejected), sum(cost), sum(warnings) FROM "+
		database+"."+table+" WHERE key != '' GROUP BY key, scope")
	if err != nil {
		return nil, fmt.Errorf("usage totals of %s.%s: %w", database, table, err)
	}
	defer rows.Close()
	out := map[UsageKey]UsageTotal{}
	for rows.Next() {
		var k UsageKey
		var t UsageTotal
		if err := rows.Scan(&k.Key, &k.Scope, &t.Requests, &t.Allowed, &t.Rejected, &t.Cost, &t.Warnings); err != nil {
			return nil, err
		}
		out[k] = t
	}
	return out, rows.Err()
}

// WaitUsageTotals waits until every rollup table (minute, hour, day) of
// database holds exactly want, and fails the test with the difference if
// that has not happened within the given time. Exactly: a series with more
// than wanted fails at once, because counts never go down.
func WaitUsageTotals(tb testing.TB, conn driver.Conn, database string, want map[UsageKey]UsageTotal, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(Timeout(within))
	var diff string
	for {
		diff = ""
		over := false
		for _, table := range RollupTables() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			got, err := UsageTotals(ctx, conn, database, table)
			cancel()
			if err != nil {
				diff = err.Error()
				break
			}
			d, o := usageDiff(got, want)
			if d != "" {
				diff = table + ": " + d
				over = o
				break
			}
		}
		if diff == "" {
			return
		}
		if over {
			tb.Fatalf("rollups count more than the distinct events: %s", diff)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("rollups not at the expected totals after %s: %s", within, diff)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func usageDiff(got, want map[UsageKey]UsageTotal) (diff string, over bool) {
	var lines []string
	for k, w := range want {
		g := got[k]
		if g != w {
			lines = append(lines, fmt.Sprintf("%s/%s got %+v want %+v", k.Key, k.Scope, g, w))
			if g.Requests > w.Requests {
				over = true
			}
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("%s/%s unexpected %+v", k.Key, k.Scope, g))
			over = true
		}
	}
	sort.Strings(lines)
	if len(lines) > 10 {
		lines = append(lines[:10], fmt.Sprintf("... and %d more", len(lines)-10))
	}
	return strings.Join(lines, "; "), over
}

// TotalsOf is what the rollups must hold for events: per key and scope, the
// requests, allowed, rejected, cost of the allowed and warnings.
func TotalsOf(evs []metering.Event) map[UsageKey]UsageTotal {
	out := map[UsageKey]UsageTotal{}
	for _, e := range evs {
		k := UsageKey{Key: e.Key, Scope: e.Scope}
		t := out[k]
		switch e.Kind {
		case metering.KindCharge:
			t.Cost += e.Actual
			out[k] = t
			continue
		case metering.KindSettle:
			// The difference, in whichever month (the rollups count it in
			// the reservation's minute: docs/reserve-settle.md).
			t.Cost += e.Actual - e.Estimate // modular, as the rollups' UInt64
			out[k] = t
			continue
		}
		t.Requests++
		if e.Allowed {
			t.Allowed++
			t.Cost += e.Cost
		} else {
			t.Rejected++
		}
		if e.Warning {
			t.Warnings++
		}
		out[k] = t
	}
	return out
}
