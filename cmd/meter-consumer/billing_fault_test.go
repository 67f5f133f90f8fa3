package main

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/billing/kafkapub"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStatementEqualsTheRecordNetOfCorrections: events with producer-retry
// duplicates, corrections published through the decisions log (one sent
// twice before and again after the consumer is SIGKILLed, 1,000 more made
// while the broker is frozen and the consumer killed), and the consumer's
// exact pipeline. The statement then
// equals the raw record net of the corrections (verify agrees), the
// correction sent three times counts once, and the voided range's usage
// is exactly zero.
func TestStatementEqualsTheRecordNetOfCorrections(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	const topic = "ratelimit.decisions"
	broker := startBroker(t, topic) // its own process, to be frozen
	db := ch.Database(t)
	env := []string{"KAFKA_BROKERS=" + broker.addr, "KAFKA_TOPIC=" + topic,
		"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db,
		"METER_BATCH_SIZE=500", "METER_BATCH_WAIT=100ms", "METER_SESSION_TIMEOUT=6s"}
	meter := startMeter(t, env)

	// 3,000 events of two keys over March 2026 (UTC), a third of them sent
	// twice (producer retries).
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	evs := make([]metering.Event, 3000)
	for i := range evs {
		evs[i] = metering.Event{EventID: fmt.Sprintf("bill%08d", i), TS: base.Add(time.Duration(i) * 14 * time.Minute).UnixMilli(),
			Key: []string{"acct", "other"}[i%2], Scope: []string{"api", "llm"}[i%3%2], Tier: "pro", Cost: uint64(1 + i%7),
			Allowed: i%11 != 0, Source: "shared", Policy: "p", Instance: "i"}
	}
	send(t, broker.addr, topic, evs)
	send(t, broker.addr, topic, evs[1000:2000])
	waitRaw(t, ch.Conn(t), db, len(evs), 3*time.Minute)

	conn := ch.Conn(t)
	store, err := chstore.New(conn, db)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: []string{broker.addr}, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	corr := &billing.Corrector{Store: store, Log: pub}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The record's totals of acct in March, and of the range voided.
	from, to := base.Add(48*time.Hour), base.Add(96*time.Hour)
	var all, voided billing.Totals
	for _, e := range evs {
		if e.Key != "acct" {
			continue
		}
		var c int64
		if e.Allowed {
			c = int64(e.Cost)
		}
		all.Requests++
		all.Cost += c
		if at := time.UnixMilli(e.TS); !at.Before(from) && at.Before(to) {
			voided.Requests++
			voided.Cost += c
		}
	}
	if voided.Requests == 0 {
		t.Fatal("the range voided holds no event: the test proves nothing")
	}
	void := billing.Request{ID: "void-feb-outage", Key: "acct", From: &from, To: &to, Reason: "test traffic billed by mistake"}
	credit := int64(-25)
	credReq := billing.Request{ID: "credit-1", Key: "acct", Cost: &credit, From: ptr(base.Add(200 * time.Hour)), Reason: "support credit"}
	for i, r := range []billing.Request{void, void, credReq} {
		c, created, err := corr.Apply(ctx, r, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if created != (i != 1) {
			t.Fatalf("request %d of %s: created %t", i, r.ID, created)
		}
		if r.ID == void.ID && (c.Net() != billing.Totals{Requests: -voided.Requests, Cost: -voided.Cost} || c.Operator != "alice") {
			t.Fatalf("the void's net %+v by %s, want -%+v by alice", c.Net(), c.Operator, voided)
		}
	}
	// 1,000 credits and debits made while the broker is frozen (SIGSTOP)
	// and the consumer SIGKILLed and started again, and the void sent a
	// third time.
	var bulk billing.Totals
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < bulkN; i += 4 {
				r := billing.Request{ID: fmt.Sprintf("bulk-%03d", i), Key: "acct", Scope: []string{"api", "llm"}[i%2],
					From: ptr(base.Add(100*time.Hour + time.Duration(i)*30*time.Minute)), Reason: "bulk adjustment"} // after the range voided, in March
				if i%3 == 0 {
					r.Requests, r.Cost = ptr(int64(i%4+1)), ptr(int64(i%7))
				} else {
					r.Cost = ptr(-int64(i%5 + 1))
				}
				c, _, err := corr.Apply(ctx, r, "bulk")
				if err != nil {
					t.Errorf("correction %s: %v", r.ID, err)
					return
				}
				mu.Lock()
				n := c.Net()
				bulk.Requests += n.Requests
				bulk.Cost += n.Cost
				mu.Unlock()
			}
		}()
	}
	broker.signal(t, syscall.SIGSTOP)
	meter.kill()
	meter = startMeter(t, env)
	waitUntil(t, time.Minute, "the new consumer to answer /readyz", func() bool { return meter.readyz() != 0 })
	broker.signal(t, syscall.SIGCONT)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if _, created, err := corr.Apply(ctx, void, "bob"); err != nil || created {
		t.Fatalf("the void again: created %t, %v", created, err)
	}
	other := void
	other.Reason = "another reason"
	if _, _, err := corr.Apply(ctx, other, "alice"); err == nil {
		t.Fatal("the same id with another request was accepted")
	}

	march, err := billing.ParsePeriod("2026-03", "")
	if err != nil {
		t.Fatal(err)
	}
	st := &billing.Statements{Store: store, Now: func() time.Time { return base.AddDate(0, 0, 20) }}
	want := billing.Totals{Requests: all.Requests - voided.Requests + bulk.Requests, Cost: all.Cost - voided.Cost + credit + bulk.Cost}
	var s billing.Statement
	waitUntil(t, 3*time.Minute, "the statement net of the corrections", func() bool {
		s, err = st.Get(ctx, "acct", march, true)
		if err != nil {
			t.Fatal(err)
		}
		return s.Totals == want
	})
	if !*s.Verified || *s.Raw != want || *s.Rollups != want {
		t.Fatalf("verify: %t raw %+v rollups %+v, want %+v", *s.Verified, *s.Raw, *s.Rollups, want)
	}
	if len(s.Corrections) == 0 || s.Corrections[0].Operator == "" {
		t.Fatalf("correction lines %+v", s.Corrections)
	}
	if len(s.Corrections) < bulkN+2 {
		t.Fatalf("%d correction lines, want one per correction and scope (%d at least)", len(s.Corrections), bulkN+2)
	}
	rows, err := store.Usage(ctx, "acct", from, to)
	if err != nil {
		t.Fatal(err)
	}
	var left billing.Totals
	for _, r := range rows {
		left.Requests += r.Requests
		left.Cost += r.Cost
	}
	if left != (billing.Totals{}) {
		t.Fatalf("the voided range still holds %+v", left)
	}
	// The events each correction became are counted once in the raw record.
	var n, distinct uint64
	if err := conn.QueryRow(ctx, "SELECT count(), uniqExact(event_id) FROM "+db+".decisions_raw WHERE kind = 'correction'").Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := store.Correction(ctx, void.ID); n != distinct || n != uint64(len(c.Pieces)+1+bulkN) {
		t.Fatalf("correction events in the raw record: %d rows, %d distinct; want %d", n, distinct, len(c.Pieces)+1+bulkN)
	}
}

// bulkN is how many credits and debits the test makes around the faults.
const bulkN = 1000

func ptr[T any](v T) *T { return &v }
