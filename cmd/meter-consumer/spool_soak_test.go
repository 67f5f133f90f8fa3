package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/metering/spool"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestSoakKafkaStoppedWithSpool is the long outage of docs/spool.md, end to
// end: an emitter with a disk spool fed RATEWARDEN_SOAK_RATE decision
// events per second (default 5,000), the broker stopped for
// RATEWARDEN_SOAK_OUTAGE (make soak-spool: 10 minutes), then started again
// on its data while the events keep coming. When the spool has drained,
// ClickHouse must hold every event exactly once: decisions_raw one row per
// decision's event id, and every rollup the same count. A tenth of the
// events are settles and some charges (afterTheWork): the actual cost in
// ClickHouse must equal the actual cost charged, exactly. A soak, not part
// of make test: without RATEWARDEN_SOAK_OUTAGE it is skipped.
func TestSoakKafkaStoppedWithSpool(t *testing.T) {
	outage, err := time.ParseDuration(os.Getenv("RATEWARDEN_SOAK_OUTAGE"))
	if err != nil || outage <= 0 {
		t.Skip("a soak: set RATEWARDEN_SOAK_OUTAGE (make soak-spool)")
	}
	rate := 5000
	if s := os.Getenv("RATEWARDEN_SOAK_RATE"); s != "" {
		if rate, err = strconv.Atoi(s); err != nil || rate <= 0 {
			t.Fatalf("RATEWARDEN_SOAK_RATE=%q", s)
		}
	}
	const topic = "ratelimit.decisions"
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	conn := ch.Conn(t)
	port := testenv.FreePort(t)
	data := t.TempDir()
	startBroker := func() *testenv.Kafka {
		k, err := testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: topic, Partitions: 4, DataDir: data})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		return k
	}
	k := startBroker()
	mp := startMeter(t, []string{"KAFKA_BROKERS=" + k.Addr(), "KAFKA_TOPIC=" + topic,
		"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db})
	waitStatus(t, mp, 200, 60*time.Second)

	// The budget holds the whole outage: about 330 bytes an event on disk.
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), MaxBytes: max(int64(rate)*int64(outage.Seconds()+120)*400, 64<<20)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	em, err := kafkaemit.New(kafkaemit.Config{Brokers: []string{k.Addr()}, Topic: topic, Spool: sp,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	emCtx, stopEm := context.WithCancel(context.Background())
	emDone := make(chan error, 1)
	go func() { emDone <- em.Run(emCtx) }()
	defer func() { stopEm(); <-emDone }()

	ids := metering.NewIDs()
	var n, decisions int
	var charged uint64         // the actual cost of the events made (costOf)
	var last [5]metering.Event // the five events before the next, by n % 5
	// emit feeds rate events per second for d.
	emit := func(d time.Duration) {
		start, sent := time.Now(), 0
		for el := time.Duration(0); el < d; el = time.Since(start) {
			for due := int(el.Seconds() * float64(rate)); sent < due; sent++ {
				now := time.Now()
				ev := metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: fmt.Sprintf("acct_%03d", n%1000),
					Scope: []string{"api:search", "api:read", "api:write"}[n%3], Tier: "pro", Cost: 1 + uint64(n%5), Allowed: n%10 != 3,
					Source: "shared", Remaining: 10, Limit: 100, Policy: "pro", Instance: "soak"}
				var before *metering.Event
				if n >= 5 {
					before = &last[n%5]
				}
				afterTheWork(&ev, n, before)
				last[n%5] = ev
				if ev.IsDecision() {
					decisions++
				}
				charged += costOf([]metering.Event{ev})
				em.Emit(ev)
				n++
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	spoolEvents := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "metering_spool_events" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no metering_spool_events")
		return 0
	}

	emit(20 * time.Second)
	t.Logf("%d events before the outage; stopping the broker for %s", n, outage)
	k.Close()
	emit(outage)
	t.Logf("%d events by the end of the outage, %.0f in the spool; starting the broker again", n, spoolEvents())
	k = startBroker()
	back := time.Now()
	emit(60 * time.Second) // fresh events beside the drain
	waitUntil(t, 2*outage+5*time.Minute, "the spool to drain", func() bool { return spoolEvents() == 0 })
	t.Logf("%d events in all; the spool drained %s after the broker came back", n, time.Since(back).Round(time.Second))
	if d := em.Dropped(); d != 0 {
		t.Fatalf("%d events dropped with a spool", d)
	}

	want := uint64(decisions)
	var raw, distinct, minute, hour, day, cost uint64
	waitUntil(t, 10*time.Minute, fmt.Sprintf("ClickHouse to hold the %d events", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		q := func(sql string) uint64 {
			var v uint64
			if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
				t.Logf("%s: %v", sql, err)
			}
			return v
		}
		raw = q("SELECT count() FROM " + db + ".decisions_raw")
		distinct = q("SELECT uniqExact(event_id) FROM " + db + ".decisions_raw")
		minute = q("SELECT sum(requests) FROM " + db + ".usage_minute WHERE key != ''")
		hour = q("SELECT sum(requests) FROM " + db + ".usage_hour WHERE key != ''")
		day = q("SELECT sum(requests) FROM " + db + ".usage_day WHERE key != ''")
		cost = q("SELECT sum(cost) FROM " + db + ".usage_minute WHERE key != ''")
		if raw > want || minute > want || hour > want || day > want {
			t.Fatalf("counted twice: %d decisions, decisions_raw %d rows, rollups %d / %d / %d", want, raw, minute, hour, day)
		}
		return raw == want && distinct == want && minute == want && hour == want && day == want && cost == charged
	})
	t.Logf("%d events (%d decisions), 0 dropped; decisions_raw %d rows (%d distinct ids), usage_minute/hour/day %d/%d/%d: 0 lost, 0 counted twice; actual cost in ClickHouse ÷ actual cost charged = %d ÷ %d = 1",
		n, want, raw, distinct, minute, hour, day, cost, charged)
}
