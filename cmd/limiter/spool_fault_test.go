package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
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
// distinct event id, and nothing is counted as dropped. Among the
// decisions, some requests reserve and settle at an actual cost below or
// above the estimate, or are charged (request): their settle and charge
// events reach Kafka through the spool as well, and the actual cost of
// the distinct events in Kafka equals the actual cost the limiter
// charged, exactly.
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

	var decided atomic.Int64 // events made: decisions, settles and charges
	var charged atomic.Int64 // the actual cost they charged
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
					events, cost, ok := request(t, p, fmt.Sprintf("acct_%d", i%97), i)
					if !ok {
						return
					}
					decided.Add(events)
					charged.Add(cost)
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
	t.Logf("%d events made so far", decided.Load())
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
	var cost int64
	waitFor(t, "every decision in Kafka", 60*time.Second, func() bool {
		ids, total, cost = topicEventIDs(t, k.Addr(), metering.DefaultTopic, 4)
		return len(ids) >= int(decided.Load())
	})
	if len(ids) != int(decided.Load()) {
		t.Fatalf("%d distinct event ids in Kafka, %d events made", len(ids), decided.Load())
	}
	if cost != charged.Load() {
		t.Fatalf("actual cost of the distinct events in Kafka %d, charged %d", cost, charged.Load())
	}
	t.Logf("%d events made (decisions, settles and charges), %d distinct events in Kafka (%d messages: the rest are resends); actual cost in Kafka ÷ actual cost charged = %d ÷ %d = 1",
		decided.Load(), len(ids), total, cost, charged.Load())
}

// request is the i-th request of the load, on key: a /check of cost 1, or
// for every tenth a reservation of 5 tokens settled at an actual cost from
// 0 to 10, and for some others a /charge of 1 to 50 tokens. It returns how
// many events that made and the actual cost it charged (ok false: it
// failed the test).
func request(t *testing.T, p *limiterProc, key string, i int) (events, cost int64, ok bool) {
	post := func(path, body string) (map[string]any, bool) {
		resp, err := client.Post(p.url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Errorf("POST %s: %v", path, err)
			return nil, false
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Errorf("POST %s %s: %d %v (%v)", path, body, resp.StatusCode, out, err)
			return nil, false
		}
		return out, true
	}
	switch {
	case i%10 == 0:
		d, ok := post("/check", fmt.Sprintf(`{"key":%q,"scope":"api:read","cost":5,"reserve":true}`, key))
		if !ok {
			return 0, 0, false
		}
		id, _ := d["reservation"].(string)
		if d["allowed"] != true || id == "" {
			return 1, 0, true
		}
		actual := int64(i * 7 % 11)
		s, ok := post("/settle", fmt.Sprintf(`{"reservation":%q,"cost":%d}`, id, actual))
		if !ok || s["settled"] != true {
			t.Errorf("settle %d of 5: %v", actual, s)
			return 0, 0, false
		}
		return 2, actual, true
	case i%23 == 11:
		actual := int64(1 + i%50)
		s, ok := post("/charge", fmt.Sprintf(`{"key":%q,"scope":"api:read","cost":%d}`, key, actual))
		if !ok || s["queued"] == true {
			t.Errorf("charge %d: %v", actual, s)
			return 0, 0, false
		}
		return 1, actual, true
	}
	d, status := p.check(t, key, "api:read", 1)
	if status != 200 {
		t.Errorf("/check answered %d", status)
		return 0, 0, false
	}
	if d.Allowed {
		return 1, 1, true
	}
	return 1, 0, true
}

// topicEventIDs reads every message of topic, counts each event id and
// returns the actual cost of the distinct events: allowed decisions'
// costs, settles' actual − estimate, charges' actual.
func topicEventIDs(t *testing.T, addr, topic string, partitions int) (map[string]int, int, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := map[string]int{}
	total := 0
	var cost int64
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
			if ids[ev.EventID] == 0 {
				switch {
				case ev.Kind == metering.KindSettle:
					cost += int64(ev.Actual) - int64(ev.Estimate)
				case ev.Kind == metering.KindCharge:
					cost += int64(ev.Actual)
				case ev.Allowed:
					cost += int64(ev.Cost)
				}
			}
			ids[ev.EventID]++
			total++
			if m.Offset >= end-1 {
				break
			}
		}
		r.Close()
	}
	return ids, total, cost
}
