package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// A log that starts over is a new epoch, not a gap: the decisions topic is
// deleted and created again under a running consumer (the new log is
// shorter than the stored offsets), then again while it is stopped and
// grows past them before it starts (only the stored event at the last
// offset tells the logs apart). Both times every event of the new log is
// counted once, the old history stays, and a producer retry that put an
// event into both logs is dropped. Then retention deletes messages before
// they are read: a gap, counted as such, and no new epoch.
func TestALogThatStartsOverIsANewEpoch(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	evs := events(8000)
	recreate := func() {
		t.Helper()
		if err := k.Cluster().DeleteTopic(k.Topic()); err != nil {
			t.Fatal(err)
		}
		if err := k.Cluster().CreateTopic(k.Topic(), 2, nil); err != nil {
			t.Fatal(err)
		}
	}

	produce(t, k.Addr(), k.Topic(), evs[:2000])
	r := startConsumer(t, conn, db, k.Addr(), k.Topic(), 300)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs[:2000]), 60*time.Second)

	// Recreated under the running consumer, shorter than the stored offsets.
	recreate()
	produce(t, k.Addr(), k.Topic(), evs[1990:2000]) // producer retries of the old log's last events
	produce(t, k.Addr(), k.Topic(), evs[2000:3000])
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs[:3000]), 60*time.Second)
	waitRawRows(t, conn, db, 3000)
	waitCounter(t, r.reg, "meter_duplicates_discarded_total", 10)
	if n := counterSum(t, r.reg, "meter_log_epochs_total", map[string]string{"reason": "restarted"}); n != 2 {
		t.Fatalf("meter_log_epochs_total{reason=restarted} = %v after recreating a topic of 2 partitions, want 2", n)
	}
	if ok, why := r.c.Ready(); !ok {
		t.Fatalf("not ready: %s", why)
	}
	r.stop()

	// Recreated while the consumer is stopped, and grown past the stored
	// offsets (1,500 messages a partition, about 500 of the previous log).
	recreate()
	produce(t, k.Addr(), k.Topic(), evs[3000:6000])
	r = startConsumer(t, conn, db, k.Addr(), k.Topic(), 300)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs[:6000]), 60*time.Second)
	waitRawRows(t, conn, db, 6000)
	if n := counterSum(t, r.reg, "meter_log_epochs_total", map[string]string{"reason": "replaced"}); n != 2 {
		t.Fatalf("meter_log_epochs_total{reason=replaced} = %v after recreating the topic and growing it past the stored offsets, want 2", n)
	}
	var epochs uint64
	if err := conn.QueryRow(context.Background(), "SELECT count() FROM "+db+".kafka_epochs").Scan(&epochs); err != nil {
		t.Fatal(err)
	}
	if epochs != 4 {
		t.Fatalf("kafka_epochs holds %d rows, want 4 (two epochs of two partitions)", epochs)
	}
	r.stop()

	// Retention deletes 1,000 messages before they are read: a gap.
	produceAcked(t, k.Addr(), k.Topic(), evs[6000:7000]) // in the log before it is cut
	for p := int32(0); p < 2; p++ {
		if err := k.Cluster().DeleteRecords(k.Topic(), p, -1); err != nil {
			t.Fatal(err)
		}
	}
	produce(t, k.Addr(), k.Topic(), evs[7000:8000])
	r = startConsumer(t, conn, db, k.Addr(), k.Topic(), 300)
	kept := append(append([]metering.Event(nil), evs[:6000]...), evs[7000:]...)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(kept), 60*time.Second)
	waitRawRows(t, conn, db, len(kept))
	if n := counterSum(t, r.reg, "meter_log_gap_messages_total", nil); n != 1000 {
		t.Fatalf("meter_log_gap_messages_total = %v, want 1000", n)
	}
	if n := counterSum(t, r.reg, "meter_log_epochs_total", nil); n != 0 {
		t.Fatalf("meter_log_epochs_total = %v after a retention gap, want 0 (the log is the same)", n)
	}
}

// A log recreated while the consumer is stopped that ends exactly at the
// last stored offset: a fetch there waits (it is the log's end), it is
// not out of range, so only the event below the end tells the logs apart.
// The consumer must take it for another log, not retry forever.
func TestALogThatEndsAtTheStoredOffsetIsANewEpoch(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 1)
	evs := events(999)
	produceAcked(t, k.Addr(), k.Topic(), evs[:500]) // offsets 0..499
	r := startConsumer(t, conn, db, k.Addr(), k.Topic(), 100)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs[:500]), 60*time.Second)
	r.stop()

	if err := k.Cluster().DeleteTopic(k.Topic()); err != nil {
		t.Fatal(err)
	}
	if err := k.Cluster().CreateTopic(k.Topic(), 1, nil); err != nil {
		t.Fatal(err)
	}
	produceAcked(t, k.Addr(), k.Topic(), evs[500:]) // offsets 0..498: the log ends at 499, the last stored offset
	r = startConsumer(t, conn, db, k.Addr(), k.Topic(), 100)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 60*time.Second)
	waitRawRows(t, conn, db, len(evs))
	if n := counterSum(t, r.reg, "meter_log_epochs_total", map[string]string{"reason": "replaced"}); n != 1 {
		t.Fatalf("meter_log_epochs_total{reason=replaced} = %v, want 1", n)
	}
}

// waitRawRows waits until decisions_raw holds want rows (its INSERT may land
// a moment after the rollups') and fails at once on more.
func waitRawRows(t *testing.T, conn driver.Conn, db string, want int) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		var raw, distinct uint64
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := conn.QueryRow(ctx, "SELECT count(), uniqExact(event_id) FROM "+db+".decisions_raw").Scan(&raw, &distinct)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if raw == uint64(want) && distinct == raw {
			return
		}
		if raw > uint64(want) || time.Now().After(deadline) {
			t.Fatalf("decisions_raw has %d rows (%d distinct ids), want %d", raw, distinct, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produceAcked writes evs and returns once the broker has appended them.
func produceAcked(t *testing.T, addr, topic string, evs []metering.Event) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.Hash{}, BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	msgs := make([]kafka.Message, len(evs))
	for i := range evs {
		msgs[i] = kafka.Message{Key: []byte(evs[i].Key), Value: evs[i].AppendEncode(nil)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// counterSum sums the counter's series whose labels include match.
func counterSum(t *testing.T, reg *prometheus.Registry, name string, match map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range match {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}
