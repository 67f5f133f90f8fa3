package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// brokerProc is a kafkadev broker in its own process.
type brokerProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func startBroker(t *testing.T, topic string) *brokerProc {
	t.Helper()
	port := testenv.FreePort(t)
	cmd := exec.Command(testenv.Binary(t, "cmd/kafka-dev"))
	cmd.Env = []string{"KAFKA_DEV_ADDR=127.0.0.1:" + strconv.Itoa(port), "KAFKA_TOPIC=" + topic, "KAFKA_DEV_PARTITIONS=4", "GORACE=" + os.Getenv("GORACE")}
	logf, err := os.Create(filepath.Join(t.TempDir(), "broker.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &brokerProc{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(b.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-b.done
	})
	waitUntil(t, 30*time.Second, "the broker process to answer", func() bool {
		c := &kafka.Client{Addr: kafka.TCP(b.addr), Timeout: time.Second}
		_, err := c.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		return err == nil
	})
	return b
}

func (b *brokerProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(b.cmd.Process.Pid, sig); err != nil {
		t.Fatal(err)
	}
}

// logEvents reads every message of the topic's 4 partitions and returns the
// distinct events among them (the first of each event id) and how many
// messages repeated an id: what ClickHouse must hold, exactly.
func logEvents(t *testing.T, addr, topic string) (distinct []metering.Event, repeats int) {
	t.Helper()
	seen := map[string]bool{}
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	for p := 0; p < 4; p++ {
		var dec metering.Decoder
		for off := int64(0); ; {
			var resp *kafka.FetchResponse
			var err error
			// A fetch that times out on a loaded machine is asked again,
			// within a minute.
			for deadline := time.Now().Add(testenv.Timeout(time.Minute)); ; {
				resp, err = client.Fetch(context.Background(), &kafka.FetchRequest{Topic: topic, Partition: p, Offset: off,
					MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 100 * time.Millisecond})
				if err == nil && resp.Error != nil {
					err = resp.Error
				}
				if !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Fatalf("partition %d offset %d: %v", p, off, err)
			}
			if off == 0 && resp.LogStartOffset != 0 {
				t.Fatalf("partition %d starts at %d: retention deleted messages", p, resp.LogStartOffset)
			}
			for {
				rec, err := resp.Records.ReadRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("partition %d: %v", p, err)
				}
				v, err := recordValue(rec)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Offset < off {
					continue
				}
				off = rec.Offset + 1
				ev, err := dec.Decode(v)
				if err != nil {
					t.Fatalf("partition %d offset %d: %v", p, rec.Offset, err)
				}
				if seen[ev.EventID] {
					repeats++
					continue
				}
				seen[ev.EventID] = true
				distinct = append(distinct, ev)
			}
			if off >= resp.HighWatermark {
				break
			}
		}
	}
	return distinct, repeats
}

// checkExact fails unless every rollup holds exactly the totals of want,
// decisions_raw one row per event of want, and the actual cost in
// ClickHouse is the actual cost charged by want.
func checkExact(t *testing.T, conn driver.Conn, db string, want []metering.Event) {
	t.Helper()
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(want), 120*time.Second)
	waitRaw(t, conn, db, len(want), 60*time.Second)
	checkStatements(t, conn, db, want) // billing: docs/billing.md, "Tested"
	inCH := actualCostIn(t, conn, db, want)
	t.Logf("ClickHouse exact: %d decisions, %d settles and charges; actual cost in ClickHouse ÷ actual cost charged = %d ÷ %d = 1",
		decisionsIn(want), len(want)-decisionsIn(want), inCH, costOf(want))
}

// TestBrokerFrozenUnderLoadCountsEveryEventOnce freezes the broker (SIGSTOP)
// while the real emitter publishes about 3,000 decisions/s, long enough for
// its writes to time out and be retried, then thaws it: the retries land
// after the originals, at new offsets, with the same event ids, and the
// test writes copies of its own amid the burst after the thaw (the
// retries' timing is the machine's; those copies are certain). Then, long
// after (beyond the consumer's in-memory window in every partition, which
// the test fills itself, and after a consumer restart), a producer sends
// the stream's early events again, and 3,000 more of the log's: each must
// be looked up in event_ids. Every event
// that reached the log must be in ClickHouse exactly once: decisions_raw one
// row per decision's event id, every rollup equal to it. A tenth of the
// events are settles and some charges (afterTheWork, as each is made): the
// actual cost in ClickHouse equals the actual cost charged by the events in
// the log, exactly, the late copies of early settles included.
func TestBrokerFrozenUnderLoadCountsEveryEventOnce(t *testing.T) {
	const dedupWindow = 2000 // METER_DEDUP_WINDOW of the consumer under test
	t.Parallel()
	const topic = "ratelimit.decisions"
	ch := testenv.StartClickHouse(t)
	b := startBroker(t, topic)
	db := ch.Database(t)
	conn := ch.Conn(t)
	env := []string{
		"KAFKA_BROKERS=" + b.addr, "KAFKA_TOPIC=" + topic,
		"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db,
		"METER_BATCH_SIZE=1000", "METER_BATCH_WAIT=100ms", "METER_SESSION_TIMEOUT=6s",
		// Small, so that the late duplicates below land far beyond it.
		"METER_DEDUP_WINDOW=" + strconv.Itoa(dedupWindow),
	}
	mp := startMeter(t, env)
	waitStatus(t, mp, 200, 60*time.Second)

	em, err := kafkaemit.New(kafkaemit.Config{Brokers: []string{b.addr}, Topic: topic, WriteTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	emCtx, stopEm := context.WithCancel(context.Background())
	emDone := make(chan error, 1)
	go func() { emDone <- em.Run(emCtx) }()

	// About 3,000 decisions/s for 12 s; the broker frozen 5 s of them.
	ids := metering.NewIDs()
	var early, made []metering.Event
	start := time.Now()
	frozen, thawed := false, false
	var retries sync.WaitGroup
	for n := 0; n < 36_000; {
		el := time.Since(start)
		if !frozen && el > 3*time.Second {
			t.Log("SIGSTOP broker")
			b.signal(t, syscall.SIGSTOP)
			frozen = true
			// A producer of its own resends early events into the frozen
			// broker, with a write timeout below the freeze: every attempt
			// times out, and all of them land once the broker resumes, the
			// same ids at new offsets.
			resent := append([]metering.Event(nil), early[:1000]...)
			retries.Add(1)
			go func() {
				defer retries.Done()
				w := &kafka.Writer{Addr: kafka.TCP(b.addr), Topic: topic, Balancer: &kafka.Hash{}, BatchSize: 1000,
					BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, MaxAttempts: 3,
					WriteTimeout: time.Second, ReadTimeout: time.Second}
				defer w.Close()
				msgs := make([]kafka.Message, len(resent))
				for i := range resent {
					msgs[i] = kafka.Message{Key: []byte(resent[i].Key), Value: resent[i].AppendEncode(nil)}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				defer cancel()
				_ = w.WriteMessages(ctx, msgs...) // times out: the broker is frozen
			}()
		}
		if frozen && !thawed && el > 8*time.Second {
			t.Log("SIGCONT broker")
			b.signal(t, syscall.SIGCONT)
			thawed = true
			// Copies amid the burst that follows the thaw, for certain:
			// events of the moment written twice, so that memory (not
			// event_ids) must find the second of each while the
			// emitter's retries and backlog land around them.
			sendTwice(t, b.addr, topic, burstCopies(ids))
		}
		for target := min(36_000, int(el.Seconds()*3000)); n < target; n++ {
			now := time.Now()
			made = append(made, metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: fmt.Sprintf("acct_%02d", n%40),
				Scope: []string{"api:search", "api:read", "api:write"}[n%3], Tier: "pro", Cost: uint64(1 + n%5),
				Allowed: n%4 != 0, Source: "shared", Remaining: 1, Limit: 100, Policy: "pro", Warning: n%7 == 0, Instance: "lim-1"})
			var before *metering.Event
			if n >= 5 {
				before = &made[n-5]
			}
			afterTheWork(&made[n], n, before)
			ev := made[n]
			if n < 3000 {
				early = append(early, ev)
			}
			em.Emit(ev)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopEm()
	<-emDone
	retries.Wait()
	t.Logf("emitter: %d sent, %d dropped", em.Sent(), em.Dropped())

	want, repeats := logEvents(t, b.addr, topic)
	t.Logf("the log holds %d distinct events and %d repeated ids", len(want), repeats)
	// How many of the retries sent into the frozen broker land after the
	// thaw is the machine's timing; the copies sent after it are certain.
	if repeats < burstCopiesN {
		t.Fatalf("%d repeated ids in the log, want at least the %d copies sent after the thaw", repeats, burstCopiesN)
	}
	checkExact(t, conn, db, want)

	// Much later: beyond the consumer's memory in every partition, which
	// holds at most window + window/2 positions (dedup.go). The test makes
	// that distance itself, with fresh events spread evenly over the four
	// partitions, rather than counting on the stream above to have placed
	// the copies of the freeze (which may land late) far enough back.
	spacer := make([]metering.Event, 0, 4*dedupWindow*2)
	for range cap(spacer) {
		now := time.Now()
		spacer = append(spacer, metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: "acct_spacer", Scope: "api:read",
			Tier: "pro", Cost: 1, Allowed: true, Source: "shared", Remaining: 1, Limit: 100, Policy: "pro", Instance: "lim-1"})
	}
	sendWith(t, b.addr, topic, &kafka.RoundRobin{}, spacer)
	// And after a restart of the consumer: late copies (a producer retry,
	// or a spool resent, long after) of the first 3,000 events made, of
	// which those the emitter dropped reach the log for the first time,
	// and of 3,000 more that the log holds, taken across it: how many of
	// the first the emitter wrote is the machine's timing; copies of
	// events in the log are certain.
	late := append([]metering.Event(nil), early...)
	isEarly := make(map[string]bool, len(early))
	for _, ev := range early {
		isEarly[ev.EventID] = true
	}
	for i, step, n := 0, max(1, len(want)/len(early)), 0; i < len(want) && n < len(early); i += step {
		if !isEarly[want[i].EventID] { // one copy of each id: a second would be found in memory
			late = append(late, want[i])
			n++
		}
	}
	mp.kill()
	mp = startMeter(t, env)
	waitStatus(t, mp, 200, 60*time.Second)
	send(t, b.addr, topic, late)
	// A fresh marker to wait on: new events after the late duplicates.
	var tail []metering.Event
	for i := 0; i < 500; i++ {
		now := time.Now()
		tail = append(tail, metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: "acct_tail", Scope: "api:read",
			Tier: "pro", Cost: 1, Allowed: true, Source: "shared", Remaining: 1, Limit: 100, Policy: "pro", Instance: "lim-1"})
	}
	send(t, b.addr, topic, tail)
	// An early event that the emitter dropped (its write timed out on a
	// busy machine and never landed) first reaches the log now: it is
	// new there, not a repeat.
	inLog := make(map[string]bool, len(want))
	for _, ev := range want {
		inLog[ev.EventID] = true
	}
	wantDistinct, wantRepeats := len(want)+len(spacer)+len(tail), repeats
	for _, ev := range late {
		if inLog[ev.EventID] {
			wantRepeats++
		} else {
			wantDistinct++
		}
	}
	want2, repeats2 := logEvents(t, b.addr, topic)
	if len(want2) != wantDistinct || repeats2 < wantRepeats {
		t.Fatalf("the log holds %d distinct events (%d repeated), want %d (at least %d)", len(want2), repeats2, wantDistinct, wantRepeats)
	}
	checkExact(t, conn, db, want2)
	// The late copies were found in event_ids, not let through and
	// collapsed some other way: each lies beyond memory (the spacer), so
	// each is looked up, whether its original is in the log or not.
	if got := mp.counter(t, "meter_duplicates_discarded_total"); got < float64(wantRepeats-repeats) {
		t.Errorf("meter_duplicates_discarded_total = %v after the late copies, want at least %d", got, wantRepeats-repeats)
	}
	if got := mp.counter(t, "meter_dedup_lookups_total"); got < float64(len(late)) {
		t.Errorf("meter_dedup_lookups_total = %v, want at least %d: the late copies were decided without event_ids", got, len(late))
	}
}

// burstCopiesN is how many events sendTwice writes twice after the thaw.
const burstCopiesN = 200

// burstCopies makes burstCopiesN new events of the moment.
func burstCopies(ids *metering.IDs) []metering.Event {
	evs := make([]metering.Event, burstCopiesN)
	for i := range evs {
		now := time.Now()
		evs[i] = metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: fmt.Sprintf("acct_copy_%d", i%8), Scope: "api:read",
			Tier: "pro", Cost: 1, Allowed: true, Source: "shared", Remaining: 1, Limit: 100, Policy: "pro", Instance: "lim-1"}
	}
	return evs
}

// sendTwice writes evs, then each of them again: the second write lands
// at later offsets of the same partitions (the key decides), each a copy.
func sendTwice(t *testing.T, addr, topic string, evs []metering.Event) {
	t.Helper()
	send(t, addr, topic, evs)
	send(t, addr, topic, evs)
}

// counter scrapes one unlabelled counter from /metrics.
func (p *meterProc) counter(t *testing.T, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(p.scrape(t), "\n") {
		var v float64
		if _, err := fmt.Sscanf(l, name+" %g", &v); err == nil {
			return v
		}
	}
	t.Fatalf("%s: no %s", p.addr, name)
	return 0
}

func send(t *testing.T, addr, topic string, evs []metering.Event) {
	t.Helper()
	sendWith(t, addr, topic, &kafka.Hash{}, evs)
}

// sendWith writes evs to the topic, spread over its partitions by bal.
func sendWith(t *testing.T, addr, topic string, bal kafka.Balancer, evs []metering.Event) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: bal, BatchSize: 1000,
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
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

func recordValue(rec *kafka.Record) ([]byte, error) {
	defer rec.Value.Close()
	if rec.Key != nil {
		defer rec.Key.Close()
	}
	return io.ReadAll(rec.Value)
}
