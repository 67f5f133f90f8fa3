package consumer_test

import (
	"context"
	"fmt"
	"io"

	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var ch *testenv.ClickHouse

func TestMain(m *testing.M) {
	serveBrokerIfAsked()
	code := testenv.MainWithClickHouse(m, &ch)
	chCluster.Close() // started only by BenchmarkEndToEnd -meter.cluster
	os.Exit(code)
}

// events makes n distinct events over 20 keys and 2 scopes whose
// timestamps cross a month boundary (UTC) half way.
func events(n int) []metering.Event {
	base := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC).UnixMilli()
	out := make([]metering.Event, n)
	for i := range out {
		out[i] = metering.Event{
			EventID: fmt.Sprintf("ev-%08d", i), TS: base + int64(i)*120_000/int64(n),
			Key: fmt.Sprintf("k%02d", i%20), Scope: []string{"api:search", "api:read"}[i%2], Tier: "pro",
			Cost: uint64(i % 7), Allowed: i%3 != 0, Source: "shared", Remaining: 5, Limit: 100,
			Policy: "pro", Warning: i%5 == 0, Instance: "test",
		}
	}
	return out
}

func produce(t *testing.T, addr, topic string, evs []metering.Event) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.Hash{}, BatchSize: 1000, BatchTimeout: time.Millisecond}
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

type running struct {
	c      *consumer.Consumer
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startConsumer(t *testing.T, conn driver.Conn, db, broker, topic string, batch int) *running {
	t.Helper()
	return startConsumerWith(t, conn, db, broker, topic, batch, 0)
}

// startConsumerWith starts a consumer whose stall watchdog fires after
// stallAfter without progress (0 = the default).
func startConsumerWith(t *testing.T, conn driver.Conn, db, broker, topic string, batch int, stallAfter time.Duration) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := consumer.InsertMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(conn, db, obs)
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Brokers: []string{broker}, Topic: topic, Sink: sink, Ping: conn.Ping,
		BatchSize: batch, BatchWait: 100 * time.Millisecond, SessionTimeout: 2 * time.Second,
		StallAfter: stallAfter, Logger: testLogger(), Registry: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(testenv.Timeout(20 * time.Second)):
			panic("consumer did not stop within 20 s")
		}
	})
}

func setup(t *testing.T) (driver.Conn, string) {
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := applySchema(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	return conn, db
}

func applySchema(ctx context.Context, conn driver.Conn, db string) error {
	return schema.Apply(ctx, conn, db)
}

func TestConsumesIntoRollupsExactly(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 4)
	evs := events(5000)
	produce(t, k.Addr(), k.Topic(), evs[:3000])
	r := startConsumer(t, conn, db, k.Addr(), k.Topic(), 700)
	produce(t, k.Addr(), k.Topic(), evs[3000:])
	// Producer retries: the same events again, at new offsets.
	produce(t, k.Addr(), k.Topic(), evs[4000:4500])
	// Poison: not JSON, and a decision time DateTime cannot hold. Both are
	// skipped and counted; neither may block its partition.
	future := evs[0]
	future.EventID, future.TS = "future", time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	w := &kafka.Writer{Addr: kafka.TCP(k.Addr()), Topic: k.Topic(), Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(),
		kafka.Message{Key: []byte("k00"), Value: []byte("not an event")},
		kafka.Message{Key: []byte("k00"), Value: future.AppendEncode(nil)}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	produce(t, k.Addr(), k.Topic(), evs[4500:4501]) // a duplicate after the poison
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 60*time.Second)

	// A batch's four INSERTs run concurrently: the raw table may land a
	// moment after the rollups. More rows than events fails at once.
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		var raw uint64
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".decisions_raw").Scan(&raw)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if raw == uint64(len(evs)) {
			break
		}
		if raw > uint64(len(evs)) || time.Now().After(deadline) {
			t.Fatalf("decisions_raw has %d rows, want %d", raw, len(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitCounter(t, r.reg, "meter_duplicates_discarded_total", 501)
	waitCounter(t, r.reg, "meter_bad_messages_total", 2)
	if ok, why := r.c.Ready(); !ok {
		t.Fatalf("not ready: %s", why)
	}
	// A restart reads everything again from its ClickHouse progress and
	// changes nothing.
	r.stop()
	r = startConsumer(t, conn, db, k.Addr(), k.Topic(), 700)
	produce(t, k.Addr(), k.Topic(), evs[:10]) // old duplicates, within the window
	// Once the restarted consumer has discarded those ten (and counted
	// nothing it read again), the totals must be unchanged.
	waitCounter(t, r.reg, "meter_duplicates_discarded_total", 10)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 30*time.Second)
}

// waitCounter waits until the counter reaches want (messages may still be
// in flight when the totals are already right) and fails if it passes it.
func waitCounter(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(20 * time.Second))
	for {
		v := counter(t, reg, name)
		if v == want {
			return
		}
		if v > want || time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", name, v, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// testLogger writes the consumer's debug log to stderr with -v, else nowhere.
func testLogger() *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
