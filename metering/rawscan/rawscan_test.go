package rawscan

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The SQL is fixed text; every value is a bound argument.
func TestQueryBindsEveryValue(t *testing.T) {
	from := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	to := from.Add(24 * time.Hour)
	q := Query{Database: "ratelimit", From: from, To: to, Sample: 0.01}
	sql, args := q.toSQL(from, to)
	want := "SELECT ts, key, scope, tier, cost, allowed, source, policy, dry_run, policy_revision, decided_us, kind, reservation, estimate, actual, priority FROM ratelimit.decisions_raw" +
		" WHERE event_time >= toDateTime(?) AND event_time <= toDateTime(?) AND ts >= ? AND ts < ?" +
		" AND kind != 'correction' AND cityHash64(key) % ? < ? ORDER BY ifNull(decided_us, toInt64(ts) * 1000), remaining DESC, allowed DESC, kafka_partition, kafka_offset"
	if sql != want {
		t.Fatalf("sql:\n got %s\nwant %s", sql, want)
	}
	if got := fmt.Sprint(args...); got != fmt.Sprint(uint32(from.Unix()), uint32(to.Unix()), uint64(from.UnixMilli()), uint64(to.UnixMilli()), uint64(1_000_000), uint64(10_000)) {
		t.Fatalf("args %v", args)
	}
	full, _ := Query{Database: "d", Sample: 1}.toSQL(from, to)
	if strings.Contains(full, "cityHash64") {
		t.Fatalf("an unsampled query samples: %s", full)
	}
}

func TestCountBindsEveryValue(t *testing.T) {
	from := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	sql, args := Query{Database: "ratelimit", From: from, To: to, Sample: 0.5}.countSQL()
	want := "SELECT count() FROM ratelimit.decisions_raw WHERE event_time >= toDateTime(?) AND event_time <= toDateTime(?) AND ts >= ? AND ts < ? AND kind != 'correction'"
	if sql != want {
		t.Fatalf("sql:\n got %s\nwant %s", sql, want)
	}
	if got := fmt.Sprint(args...); got != fmt.Sprint(uint32(from.Unix()), uint32(to.Unix()), uint64(from.UnixMilli()), uint64(to.UnixMilli())) {
		t.Fatalf("args %v", args)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	now := time.Now()
	err := Query{Database: "x; DROP TABLE y", From: now, To: now, Sample: 2}.Validate()
	if err == nil || !strings.Contains(err.Error(), "identifier") || !strings.Contains(err.Error(), "empty") || !strings.Contains(err.Error(), "sample") {
		t.Fatalf("err = %v", err)
	}
}
