package chsink_test

import (
	"context"
	"testing"
	"time"
)

// A traced decision's trace id reaches decisions_raw.trace_id; an untraced
// one's is NULL, so "WHERE trace_id = ..." finds exactly the traced row.
func TestWriteRecordsTraceID(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()
	recs := records(0, 4, time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC))
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	recs[2].Event.TraceID = trace
	p, err := s.Progress(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 3, recs, 3, &p); err != nil {
		t.Fatal(err)
	}
	var id string
	var off, nulls uint64
	if err := conn.QueryRow(ctx, "SELECT any(event_id), any(kafka_offset) FROM "+db+".decisions_raw WHERE trace_id = ?", trace).Scan(&id, &off); err != nil {
		t.Fatal(err)
	}
	if id != recs[2].Event.EventID || off != 2 {
		t.Fatalf("the traced row: event %q offset %d, want %q at 2", id, off, recs[2].Event.EventID)
	}
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".decisions_raw WHERE kafka_partition = 3 AND isNull(trace_id)").Scan(&nulls); err != nil {
		t.Fatal(err)
	}
	if nulls != 3 {
		t.Fatalf("%d untraced rows with a NULL trace_id, want 3", nulls)
	}
}
