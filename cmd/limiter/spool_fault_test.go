package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkadev"
	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/metering"
)

const spoolPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 100000, burst: 100000 }
`

// TestFaultKafkaStoppedSpoolLosesNothing: the broker stops mid-stream for
// long enough to fill the limiter's buffer (256 events) many times over;
// the limiter spools, is SIGKILLed with a full spool and started again on
// the same directory (still without a broker), decides more, and then the
// broker comes back (its log kept): every decision made reaches Kafka, by
// distinct event id, and nothing is counted as dropped.
func TestFaultKafkaStoppedSpoolLosesNothing(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	data := t.TempDir()
	startBroker := func() *testenv.Kafka {
		k, err := testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: metering.DefaultTopic, Partitions: 4, DataDir: data})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		return k
	}
	k := startBroker()
	spoolDir := t.TempDir()
	env := []string{"KAFKA_BROKERS=" + k.Addr(), "LIMITER_EMIT_BUFFER=256", "LIMITER_SPOOL_DIR=" + spoolDir}
	p := startLimiter(t, spoolPolicy, env...)

	var decided atomic.Int64
	// load makes n decisions, or with for > 0 as many as it can in that
	// time.
	load := func(p *limiterProc, n int, d ...time.Duration) {
		until := time.Time{}
		if len(d) > 0 && d[0] > 0 {
			until, n = time.Now().Add(d[0]), 1<<62
		}
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n && (until.IsZero() || time.Now().Before(until)); i += 8 {
					if _, status := p.check(t, fmt.Sprintf("acct_%d", i%97), "api:read", 1); status != 200 {
						t.Errorf("/check answered %d", status)
						return
					}
					decided.Add(1)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	spooled := func(p *limiterProc) (events float64, waiting bool) {
		m, _ := p.readyz(t)["metering"].(map[string]any)
		s, _ := m["spool"].(map[string]any)
		if s == nil {
			t.Fatalf("/readyz shows no spool: %v", m)
		}
		events, _ = s["events"].(float64)
		waiting, _ = s["waitingForKafka"].(bool)
		return events, waiting
	}

	load(p, 1000)
	t.Log("stopping the broker")
	k.Close()
	// RATEWARDEN_SPOOL_OUTAGE=10m: the outage lasts that long under as
	// much load as the test makes (a measurement, not part of make test).
	outage, _ := time.ParseDuration(os.Getenv("RATEWARDEN_SPOOL_OUTAGE"))
	load(p, 4000, outage)
	t.Logf("%d decisions made so far", decided.Load())
	// Every event is sent or spooled (an unconfirmed one may be both).
	waitFor(t, "every decision sent or spooled", 60*time.Second, func() bool {
		ev, waiting := spooled(p)
		return waiting && ev+p.metric(t, "metering_emitter_events_sent_total") >= float64(decided.Load())
	})
	if d := p.metric(t, "metering_emitter_events_dropped_total"); d != 0 {
		t.Fatalf("%v events dropped with a spool", d)
	}
	before, _ := spooled(p)
	t.Logf("SIGKILL with %v events spooled", before)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done

	p = startLimiter(t, spoolPolicy, env...)
	if ev, _ := spooled(p); ev < before {
		t.Fatalf("the restarted limiter's spool holds %v events, the killed one had %v", ev, before)
	}
	load(p, 1000) // still no broker
	t.Log("starting the broker again")
	k = startBroker()
	load(p, 1000) // decisions keep flowing while the spool drains
	waitFor(t, "the spool drained", 90*time.Second+time.Duration(decided.Load())*time.Second/10000, func() bool {
		ev, waiting := spooled(p)
		return ev == 0 && !waiting
	})
	if d := p.metric(t, "metering_emitter_events_dropped_total"); d != 0 {
		t.Fatalf("%v events dropped with a spool", d)
	}
	// The last fresh events may still be in the buffer: wait for Kafka
	// to hold as many distinct ids as decisions were made, or fail.
	var ids map[string]int
	var total int
	waitFor(t, "every decision in Kafka", 60*time.Second, func() bool {
		ids, total = topicEventIDs(t, k.Addr(), metering.DefaultTopic, 4)
		return len(ids) >= int(decided.Load())
	})
	if len(ids) != int(decided.Load()) {
		t.Fatalf("%d distinct event ids in Kafka, %d decisions", len(ids), decided.Load())
	}
	t.Logf("%d decisions, %d distinct events in Kafka (%d messages: the rest are resends)", decided.Load(), len(ids), total)
}

// topicEventIDs reads every message of topic and counts each event id.
func topicEventIDs(t *testing.T, addr, topic string, partitions int) (map[string]int, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := map[string]int{}
	total := 0
	for part := 0; part < partitions; part++ {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, part)
		if err != nil {
			t.Fatalf("dial the leader of partition %d: %v", part, err)
		}
		end, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if end == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: part, MaxWait: 50 * time.Millisecond})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("partition %d: read up to %d: %v", part, end, err)
			}
			ev, err := metering.Decode(m.Value)
			if err != nil {
				t.Fatalf("partition %d offset %d: %v", part, m.Offset, err)
			}
			ids[ev.EventID]++
			total++
			if m.Offset >= end-1 {
				break
			}
		}
		r.Close()
	}
	return ids, total
}
