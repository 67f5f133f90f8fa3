package kafkaemit_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func event(i int) metering.Event {
	return metering.Event{
		EventID: fmt.Sprintf("ev-%08d", i), TS: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).UnixMilli() + int64(i),
		Key: fmt.Sprintf("acct_%d", i%50), Scope: "api:search", Tier: "pro", Cost: 1, Allowed: i%4 != 0,
		Source: "shared", Remaining: 3, Limit: 100, Policy: "pro", Instance: "lim-1",
	}
}

// emitter is an Emitter whose Run runs until stop (or the test's end).
type emitter struct {
	*kafkaemit.Emitter
	stop func() error // ends Run's context and returns what Run returned
}

func newEmitter(tb testing.TB, brokers string, cfg kafkaemit.Config) (emitter, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	cfg.Brokers = []string{brokers}
	if cfg.Topic == "" {
		cfg.Topic = "decisions"
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	cfg.Registry = reg
	if cfg.FlushTimeout == 0 {
		// The flush returns as soon as the buffer is written; the bound is
		// only for a broken one, and generous so that a loaded machine is
		// not one.
		cfg.FlushTimeout = time.Minute
	}
	e, err := kafkaemit.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- e.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error { once.Do(func() { cancel(); runErr = <-errc }); return runErr }
	tb.Cleanup(func() { _ = stop() })
	return emitter{e, stop}, reg
}

func counterValue(tb testing.TB, reg *prometheus.Registry, name, reason string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := reason == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					match = true
				}
			}
			if match {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// readAll reads every message of topic, by partition: each partition up to
// its end offset, read from the broker first. (Reading until nothing comes
// for a while would stop early whenever a fetch is slow.)
func readAll(t *testing.T, addr, topic string, partitions, want int) map[int][]kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[int][]kafka.Message{}
	total := 0
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			t.Fatalf("dial the leader of partition %d: %v", p, err)
		}
		end, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatalf("end offset of partition %d: %v", p, err)
		}
		if end == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: p, MaxWait: 50 * time.Millisecond})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("partition %d: read up to offset %d: %v (%d read)", p, end, err, len(out[p]))
			}
			out[p] = append(out[p], m)
			total++
			if m.Offset >= end-1 {
				break
			}
		}
		r.Close()
	}
	if total != want {
		t.Fatalf("read %d messages, want %d", total, want)
	}
	return out
}

func TestEmitsKeyedEventsAndFlushesAtTheEnd(t *testing.T) {
	k := testenv.StartKafka(t, "decisions", 4)
	e, reg := newEmitter(t, k.Addr(), kafkaemit.Config{})
	const n = 20000
	for i := 0; i < n; i++ {
		e.Emit(event(i))
	}
	if err := e.stop(); err != nil { // Run returns once the buffer is flushed
		t.Fatal(err)
	}
	if e.Dropped() != 0 || e.Sent() != n {
		t.Fatalf("sent %d dropped %d, want %d and 0", e.Sent(), e.Dropped(), n)
	}
	if v := counterValue(t, reg, "metering_emitter_events_sent_total", ""); v != n {
		t.Fatalf("sent metric %v, want %d", v, n)
	}
	byPart := readAll(t, k.Addr(), "decisions", 4, n)
	seen := map[string]bool{}
	keyPart := map[string]int{}
	for p, msgs := range byPart {
		lastTS := map[string]int64{}
		for _, m := range msgs {
			ev, err := metering.Decode(m.Value)
			if err != nil {
				t.Fatal(err)
			}
			if string(m.Key) != ev.Key {
				t.Fatalf("message key %q, event key %q", m.Key, ev.Key)
			}
			if q, ok := keyPart[ev.Key]; ok && q != p {
				t.Fatalf("key %s in partitions %d and %d", ev.Key, q, p)
			}
			keyPart[ev.Key] = p
			if ev.TS < lastTS[ev.Key] {
				t.Fatalf("key %s out of order in partition %d", ev.Key, p)
			}
			lastTS[ev.Key] = ev.TS
			if ev != event(mustIndex(t, ev.EventID)) {
				t.Fatalf("event changed on the way: %+v", ev)
			}
			seen[ev.EventID] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct events in Kafka, want %d", len(seen), n)
	}
}

func mustIndex(t *testing.T, id string) int {
	var i int
	if _, err := fmt.Sscanf(id, "ev-%d", &i); err != nil {
		t.Fatal(err)
	}
	return i
}

// With no broker at all, Emit returns at once and every event is either
// dropped and counted or (never, here) sent.
func TestKafkaDownDropsAndCountsWithoutBlocking(t *testing.T) {
	k := testenv.StartKafka(t, "decisions", 4)
	addr := k.Addr()
	k.Close() // the broker is gone: connections are refused
	e, reg := newEmitter(t, addr, kafkaemit.Config{Buffer: 1000, WriteTimeout: 500 * time.Millisecond})
	const n = 50000
	for i := 0; i < n; i++ {
		e.Emit(event(i)) // a blocking Emit would hang here until the test times out
	}
	// Run returns once the last write has failed (3 attempts of at most
	// 500 ms, refused at once here). A short FlushTimeout could cut those
	// writes off on a loaded machine, and then no drop would be counted as
	// a Kafka error, which is asserted below.
	_ = e.stop()
	if e.Sent() != 0 || e.Dropped() != n {
		t.Fatalf("sent %d dropped %d, want 0 and %d (every event accounted for)", e.Sent(), e.Dropped(), n)
	}
	if d := counterValue(t, reg, "metering_emitter_events_dropped_total", ""); d != n {
		t.Fatalf("dropped metric %v, want %d", d, n)
	}
	if counterValue(t, reg, "metering_emitter_events_dropped_total", kafkaemit.ReasonRefused) == 0 {
		t.Fatal("no refused drops counted with the broker down")
	}
	e.Emit(event(0))
	if e.Dropped() != n+1 {
		t.Fatal("Emit after Run was not counted as dropped")
	}
}

func BenchmarkEmit(b *testing.B) {
	k := testenv.StartKafka(b, "decisions", 4)
	e, _ := newEmitter(b, k.Addr(), kafkaemit.Config{})
	ev := event(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Emit(ev)
	}
	b.StopTimer()
	b.ReportMetric(float64(e.Dropped())/float64(b.N), "dropped/op")
}

func BenchmarkEmitParallel(b *testing.B) {
	k := testenv.StartKafka(b, "decisions", 4)
	e, _ := newEmitter(b, k.Addr(), kafkaemit.Config{})
	ev := event(1)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Emit(ev)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(e.Dropped())/float64(b.N), "dropped/op")
}

// BenchmarkEmitBuffered measures Emit when nothing is dropped: the buffer
// holds every event of the run (use -benchtime Nx with N ≤ 1,000,000).
func BenchmarkEmitBuffered(b *testing.B) {
	k := testenv.StartKafka(b, "decisions", 4)
	e, _ := newEmitter(b, k.Addr(), kafkaemit.Config{Buffer: min(b.N+1, 1_000_001)})
	ev := event(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Emit(ev)
	}
	b.StopTimer()
	b.ReportMetric(float64(e.Dropped())/float64(b.N), "dropped/op")
}

// A broker that accepts connections and never answers holds a write until
// its WriteTimeout; when Run's context ends, FlushTimeout cuts it (and the
// rest of the buffer) short: Run returns an error, and every event is
// accounted for, sent or dropped.
func TestFlushTimeoutCutsAHungWriteShort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	e, reg := newEmitter(t, ln.Addr().String(), kafkaemit.Config{WriteTimeout: time.Hour, FlushTimeout: 100 * time.Millisecond})
	const n = 10
	for i := 0; i < n; i++ {
		e.Emit(event(i))
	}
	err = e.stop()
	if err == nil || !strings.Contains(err.Error(), "flush cut short") {
		t.Fatalf("Run = %v, want the flush cut short", err)
	}
	if e.Sent()+e.Dropped() != n || e.Sent() != 0 {
		t.Fatalf("sent %d dropped %d, want 0 and %d", e.Sent(), e.Dropped(), n)
	}
	if d := counterValue(t, reg, "metering_emitter_events_dropped_total", ""); d != n {
		t.Fatalf("dropped metric %v, want %d", d, n)
	}
}

func kafkaDialLeader(addr, topic string, p int) (*kafka.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return kafka.DialLeader(ctx, "tcp", addr, topic, p)
}

func spoolSegments(dir string) ([]string, error) { return filepath.Glob(filepath.Join(dir, "*.seg")) }
