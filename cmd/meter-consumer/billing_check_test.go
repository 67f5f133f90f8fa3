package main

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// checkStatements fails unless, after the faults of the test that calls
// it, every key's billing statement of every month of want (UTC) equals
// the raw record (verify: per scope, the rollups equal decisions_raw) and
// the months' statements of a key sum to its events' totals. Call it once
// the rollups and decisions_raw are exact (checkExact, waitRaw).
func checkStatements(t *testing.T, conn driver.Conn, db string, want []metering.Event) {
	t.Helper()
	store, err := chstore.New(conn, db)
	if err != nil {
		t.Fatal(err)
	}
	st := &billing.Statements{Store: store}
	perKey := map[string]billing.Totals{}
	for k, v := range testenv.TotalsOf(want) {
		s := perKey[k.Key]
		s.Requests += int64(v.Requests)
		s.Cost += int64(v.Cost) // modular, as the rollups' UInt64 read as signed
		perKey[k.Key] = s
	}
	months := map[string]bool{}
	for _, e := range want {
		months[time.UnixMilli(e.TS).UTC().Format("2006-01")] = true
	}
	var periods []string
	for m := range months {
		periods = append(periods, m)
	}
	sort.Strings(periods)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(3*time.Minute))
	defer cancel()
	for key, wantT := range perKey {
		var got billing.Totals
		for _, m := range periods {
			p, err := billing.ParsePeriod(m, "")
			if err != nil {
				t.Fatal(err)
			}
			s, err := st.Get(ctx, key, p, true)
			if err != nil {
				t.Fatal(err)
			}
			if !*s.Verified || s.Totals != *s.Raw {
				t.Fatalf("statement of %s %s: totals %+v, raw record %+v, rollups %+v, verified %t", key, m, s.Totals, *s.Raw, *s.Rollups, *s.Verified)
			}
			got.Requests += s.Totals.Requests
			got.Cost += s.Totals.Cost
		}
		if got != wantT {
			t.Fatalf("statements of %s over %v sum to %+v; its events to %+v", key, periods, got, wantT)
		}
	}
	t.Logf("billing statements: %d keys x %v, each equal to the raw record", len(perKey), periods)
}
