package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestExactTotalsAcrossALogThatStartsOver streams events while two
// meter-consumer processes run, and mid-stream the decisions topic is
// deleted and created again, later the broker is replaced by a fresh one on
// the same port (what `make down; make up` does to the embedded broker), and
// a consumer is SIGKILLed after each. Each time, producer retries put the
// last events before the change into the new log too. Every rollup must
// then hold exactly one count per distinct event, decisions_raw one row per
// event id, the history of every earlier log kept, and each partition must
// have recorded one epoch per change. A tenth of the events are settles
// and some charges (withSettles): the actual cost in ClickHouse equals the
// actual cost charged, exactly.
//
// Before each change the producer pauses until the consumers have read
// what it wrote: a log deleted with unread messages takes them with it (no
// consumer can count what it never saw), which is why moving to a new log
// is done after the consumers have drained the old one (docs/metering.md).
func TestExactTotalsAcrossALogThatStartsOver(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	const topic, partitions = "ratelimit.decisions", 4

	ch := testenv.StartClickHouse(t)
	k := testenv.StartKafka(t, topic, partitions)
	port := k.Port()
	db := ch.Database(t)
	conn := ch.Conn(t)
	env := []string{
		"KAFKA_BROKERS=" + k.Addr(), "KAFKA_TOPIC=" + topic,
		"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db,
		"METER_BATCH_SIZE=1000", "METER_BATCH_WAIT=100ms", "METER_SESSION_TIMEOUT=6s",
	}
	evs := withSettles(faultEvents(24_000))

	// send writes evs until the broker has them all, retrying through the
	// change of log (a retried write may land twice: the same event ids).
	send := func(part []metering.Event) error {
		msgs := make([]kafka.Message, len(part))
		for i := range part {
			msgs[i] = kafka.Message{Key: []byte(part[i].Key), Value: part[i].AppendEncode(nil)}
		}
		deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
		for {
			w := &kafka.Writer{Addr: kafka.TCP(k.Addr()), Topic: topic, Balancer: &kafka.Hash{},
				BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := w.WriteMessages(ctx, msgs...)
			cancel()
			w.Close()
			if err == nil {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("produce: %w", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	procs := []*meterProc{startMeter(t, env), startMeter(t, env)}
	for _, p := range procs {
		waitStatus(t, p, http.StatusOK, 30*time.Second)
	}
	var kills int
	kill := func() {
		kills++
		j := rng.IntN(len(procs))
		t.Logf("SIGKILL consumer %d", j)
		procs[j].kill()
		procs[j] = startMeter(t, env)
		waitStatus(t, procs[j], http.StatusOK, 60*time.Second)
	}
	// stream writes evs in chunks of 500 every 100 ms, with producer-retry
	// duplicates of recent chunks, in the background, while the test
	// SIGKILLs a consumer after killAfter.
	stream := func(part []metering.Event, killAfter time.Duration) {
		t.Helper()
		rr := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		done := make(chan error, 1)
		go func() {
			for i := 0; i < len(part); i += 500 {
				if err := send(part[i:min(i+500, len(part))]); err != nil {
					done <- err
					return
				}
				if i >= 1000 && rr.IntN(3) == 0 {
					from := i - 1000 + rr.IntN(500)
					if err := send(part[from : from+100]); err != nil {
						done <- err
						return
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			done <- nil
		}()
		time.Sleep(killAfter)
		kill()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	drained := func(upTo int) {
		testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs[:upTo]), 120*time.Second)
	}

	stream(evs[:8000], time.Duration(rng.IntN(1500))*time.Millisecond)
	drained(8000)
	t.Log("deleting and creating the topic again")
	if err := k.Cluster().DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	if err := k.Cluster().CreateTopic(topic, partitions, nil); err != nil {
		t.Fatal(err)
	}
	must(send(evs[7800:8000])) // producer retries across the boundary
	stream(evs[8000:16000], time.Duration(rng.IntN(1500))*time.Millisecond)
	drained(16000)

	t.Log("replacing the broker by a fresh one on the same port")
	k.Close()
	var err error
	k, err = testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: topic, Partitions: partitions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	must(send(evs[15800:16000]))
	stream(evs[16000:], time.Duration(rng.IntN(1500))*time.Millisecond)

	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 120*time.Second)
	waitRaw(t, conn, db, len(evs), 60*time.Second)
	checkStatements(t, conn, db, evs) // billing: docs/billing.md, "Tested"
	inCH := actualCostIn(t, conn, db, evs)

	var epochs uint64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.QueryRow(ctx, "SELECT uniqExact(kafka_partition, epoch) FROM "+db+".kafka_epochs").Scan(&epochs); err != nil {
		t.Fatal(err)
	}
	if epochs != 2*partitions {
		rows, _ := conn.Query(ctx, "SELECT kafka_partition, epoch, reason, first_position, start_offset, log_end FROM "+db+".kafka_epochs ORDER BY kafka_partition, epoch")
		var lines []string
		for rows != nil && rows.Next() {
			var p, e uint32
			var reason string
			var first, start, end uint64
			_ = rows.Scan(&p, &e, &reason, &first, &start, &end)
			lines = append(lines, fmt.Sprintf("p%d e%d %s first %d start %d log_end %d", p, e, reason, first, start, end))
		}
		t.Fatalf("%d epochs recorded, want %d (one per partition per change of log):\n%s", epochs, 2*partitions, strings.Join(lines, "\n"))
	}
	for _, p := range procs {
		waitStatus(t, p, http.StatusOK, 60*time.Second)
	}
	t.Logf("%d distinct events across 3 logs (%d settles and charges), %d consumer SIGKILLs: totals exact, %d epochs; actual cost in ClickHouse ÷ actual cost charged = %d ÷ %d = 1",
		len(evs), len(evs)-decisionsIn(evs), kills, epochs, inCH, costOf(evs))
}
