package chsink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

// rawOptional reads back decisions_raw's optional columns of partition,
// one line per row in offset order.
const rawOptional = "SELECT concat(domain, '|', shadow, '|', toString(shadow_rejected), '|', ifNull(trace_id, 'NULL'), '|', " +
	"ifNull(toString(policy_revision), 'NULL'), '|', ifNull(toString(decided_us), 'NULL'), '|', ifNull(toString(shadow_revision), 'NULL'), '|', " +
	"region, '|', kind, '|', reservation, '|', toString(estimate), '|', toString(actual), '|', toString(reserved_ts), '|', toString(actual_cost)) " +
	"FROM %s.decisions_raw WHERE kafka_partition = ? ORDER BY kafka_offset"

// An INSERT leaves out the optional columns that no event of its batch
// uses, and ClickHouse then fills in what the sink would have sent: the
// schema's DEFAULTs and the sink agree. A batch with an event that uses
// every one sends them all.
func TestOmittedColumnsAreTheirDefaults(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()

	kinds := map[string]string{}
	rows, err := conn.Query(ctx, "SELECT name, type, default_kind FROM system.columns WHERE database = ? AND table = 'decisions_raw'", db)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, typ, kind string
		if err := rows.Scan(&name, &typ, &kind); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(typ, "Nullable(") {
			kind = "NULL"
		}
		kinds[name] = kind
	}
	rows.Close()
	for _, name := range chsink.OptionalColumns() {
		if k := kinds[name]; k != "DEFAULT" && k != "NULL" {
			t.Errorf("optional column %s has no DEFAULT and is not Nullable (default kind %q)", name, k)
		}
	}

	base := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	plain := records(0, 4, base)
	plain[1].Event.Cost = 1 << 63 // actual_cost's DEFAULT converts as the sink does
	plain[2].Event.Kind = metering.KindDecision
	full := records(10, 3, base)
	full[1].Event = metering.Event{
		EventID: "settle", TS: base.UnixMilli() + 11, Key: "k", Scope: "s", Tier: "pro", Kind: metering.KindSettle,
		Domain: "edge", Shadow: "tight", ShadowRejected: true, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
		PolicyRevision: 7, DecidedUS: 35, ShadowRevision: 8, Region: "eu", Reservation: "r1",
		Estimate: 5, Actual: 3, ReservedTS: base.UnixMilli() + 1,
	}
	want := func(e *metering.Event) string {
		opt := func(v int64) string {
			if v == 0 {
				return "NULL"
			}
			return fmt.Sprint(v)
		}
		trace, kind, actual := e.TraceID, e.Kind, int64(0)
		if trace == "" {
			trace = "NULL"
		}
		switch {
		case kind == metering.KindSettle:
			actual = int64(e.Actual) - int64(e.Estimate)
		case e.Allowed:
			actual = int64(e.Cost)
		}
		if kind == "" {
			kind = metering.KindDecision
		}
		return fmt.Sprintf("%s|%s|%d|%s|%s|%s|%s|%s|%s|%s|%d|%d|%d|%d", e.Domain, e.Shadow, b2i(e.ShadowRejected), trace,
			opt(e.PolicyRevision), opt(e.DecidedUS), opt(e.ShadowRevision), e.Region, kind, e.Reservation,
			e.Estimate, e.Actual, e.ReservedTS, actual)
	}
	for partition, recs := range map[int][]chsink.Record{1: plain, 2: full} {
		p, err := s.Progress(ctx, partition)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(ctx, partition, recs, recs[len(recs)-1].Offset, &p); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, fmt.Sprintf(rawOptional, db), uint32(partition))
		if err != nil {
			t.Fatal(err)
		}
		var i int
		for ; rows.Next(); i++ {
			var got string
			if err := rows.Scan(&got); err != nil {
				t.Fatal(err)
			}
			if w := want(&recs[i].Event); got != w {
				t.Errorf("partition %d, row %d: optional columns %s, want %s", partition, i, got, w)
			}
		}
		rows.Close()
		if i != len(recs) {
			t.Fatalf("partition %d: %d rows, want %d", partition, i, len(recs))
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
