package chsink_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/schema"
)

// The region reaches decisions_raw; usage_region_* count the events of
// each region (and nothing of the events without one) in every bucket
// width, usage_* count all of them; a batch written again after a restart
// is counted once; a settle counts its actual cost in its region.
func TestWriteCountsUsagePerRegion(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	recs := records(0, 40, base)
	regions := []string{"a", "b", "c", ""}
	want := map[string]uint64{} // region → allowed cost
	for i := range recs {
		e := &recs[i].Event
		e.Key, e.Region = "global-key", regions[i%4]
		if e.Allowed {
			want[e.Region] += e.Cost
		}
	}
	// A settle of a reservation in region b: actual 9 for an estimate of 2.
	settle := chsink.Record{Offset: 40, Event: metering.Event{EventID: "settle-1", TS: base.UnixMilli() + 40, Key: "global-key", Scope: "s", Tier: "pro",
		Allowed: true, Source: "shared", Kind: metering.KindSettle, Estimate: 2, Actual: 9, ReservedTS: base.UnixMilli() + 1, Region: "b"}}
	recs = append(recs, settle)
	want["b"] += 7
	var total uint64
	for _, c := range want {
		total += c
	}
	for round := 0; round < 2; round++ {
		p, err := s.Progress(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(ctx, 2, recs, 40, &p); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range schema.RegionRollupTables() {
		got := map[string]uint64{}
		rows, err := conn.Query(ctx, "SELECT region, sum(cost) FROM "+db+"."+table+" WHERE key = 'global-key' GROUP BY region")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var r string
			var c uint64
			if err := rows.Scan(&r, &c); err != nil {
				t.Fatal(err)
			}
			got[r] = c
		}
		rows.Close()
		if len(got) != 3 || got["a"] != want["a"] || got["b"] != want["b"] || got["c"] != want["c"] {
			t.Fatalf("%s per region: %v, want a %d, b %d, c %d and no other", table, got, want["a"], want["b"], want["c"])
		}
	}
	for _, table := range schema.RollupTables() {
		var c uint64
		if err := conn.QueryRow(ctx, "SELECT sum(cost) FROM "+db+"."+table+" WHERE key = 'global-key'").Scan(&c); err != nil {
			t.Fatal(err)
		}
		if c != total {
			t.Fatalf("%s: cost %d, want %d (every region and none)", table, c, total)
		}
	}
	var nB, nNone uint64
	if err := conn.QueryRow(ctx, "SELECT countIf(region = 'b'), countIf(region = '') FROM "+db+"."+schema.DecisionsRaw+" WHERE kafka_partition = 2 AND kind = 'decision'").Scan(&nB, &nNone); err != nil {
		t.Fatal(err)
	}
	if nB != 10 || nNone != 10 {
		t.Fatalf("decisions_raw: %d rows of region b, %d without, want 10 and 10", nB, nNone)
	}
	p, err := s.Progress(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range []chsink.Table{chsink.RegionMinute, chsink.RegionHour, chsink.RegionDay} {
		if p[tb] != 40 {
			t.Fatalf("progress of %s = %d, want 40", tb, p[tb])
		}
	}
}

// The per-region rollups came with a later migration: until they hold a
// marker they do not send the resume point back.
func TestRegionRollupsAddedLaterDoNotRewind(t *testing.T) {
	p := chsink.Progress{500, 500, 500, 500, 500, 500, 500, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	if got := p.Resume(); got != 501 {
		t.Fatalf("resume = %d, want 501", got)
	}
	p[chsink.RegionHour] = 300
	if got := p.Resume(); got != 301 {
		t.Fatalf("resume with usage_region_hour at 300 = %d, want 301", got)
	}
}
