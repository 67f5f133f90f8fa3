package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/metering"
)

// meterProc is one meter-consumer process started by a test.
type meterProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
	err  error
	log  *bytes.Buffer
}

type syncBuffer struct {
	mu sync.Mutex
	bytes.Buffer
}

func startMeter(t *testing.T, env []string) *meterProc {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := binaryCmd(append(env, "METER_ADDR="+addr)...)
	logPath := filepath.Join(t.TempDir(), "meter.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &meterProc{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() { // the consumer's side of the story, minus debug lines
			b, _ := os.ReadFile(logPath)
			var keep []string
			for _, l := range strings.Split(string(b), "\n") {
				if l != "" && !strings.Contains(l, `"level":"DEBUG"`) {
					keep = append(keep, l)
				}
			}
			t.Logf("meter-consumer on %s log:\n%s", addr, strings.Join(keep, "\n"))
		}
	})
	return p
}

func (p *meterProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// readyz returns the /readyz status code, 0 when nothing answers.
func (p *meterProc) readyz() int {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + p.addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func waitStatus(t *testing.T, p *meterProc, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := p.readyz()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz of %s = %d after %s, want %d", p.addr, got, within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// faultEvents makes n distinct events over 40 keys and 3 scopes, with
// timestamps that cross a month boundary (UTC) a third of the way in.
func faultEvents(n int) []metering.Event {
	base := time.Date(2026, 11, 30, 23, 59, 30, 0, time.UTC).UnixMilli()
	ids := metering.NewIDs()
	out := make([]metering.Event, n)
	for i := range out {
		ts := base + int64(i)*90_000/int64(n)
		out[i] = metering.Event{
			EventID: ids.Next(time.UnixMilli(ts)), TS: ts,
			Key: fmt.Sprintf("acct_%02d", i%40), Scope: []string{"api:search", "api:read", "api:write"}[i%3], Tier: "pro",
			Cost: uint64(1 + i%5), Allowed: i%4 != 0, Source: "shared", Remaining: 1, Limit: 100,
			Policy: "pro", Warning: i%7 == 0, Instance: "lim-1",
		}
	}
	return out
}

// TestExactTotalsUnderFaults streams a known set of events (plus producer
// retries and a replayed range, i.e. the same event ids again at new
// offsets) while two consumer processes are SIGKILLed and restarted at
// random moments (each time also a rebalance) and ClickHouse is stopped and
// started again; then every rollup must hold exactly one count per distinct
// event.
func TestExactTotalsUnderFaults(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	ch := testenv.StartClickHouse(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 4)
	db := ch.Database(t)
	env := []string{
		"KAFKA_BROKERS=" + k.Addr(), "KAFKA_TOPIC=" + k.Topic(),
		"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db,
		"METER_BATCH_SIZE=1500", "METER_BATCH_WAIT=100ms", "METER_SESSION_TIMEOUT=2s",
	}
	evs := faultEvents(60_000)

	// The producer: chunks of 500 every 120 ms (about 4,000 events/s, so
	// that the stream outlasts most of the faults), with producer-retry
	// duplicates and one replayed range.
	var produced sync.WaitGroup
	produced.Add(1)
	var dups int
	var sent atomic.Int64 // distinct events produced so far
	go func() {
		defer produced.Done()
		w := &kafka.Writer{Addr: kafka.TCP(k.Addr()), Topic: k.Topic(), Balancer: &kafka.Hash{},
			BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
		defer w.Close()
		send := func(batch []metering.Event) {
			msgs := make([]kafka.Message, len(batch))
			for i := range batch {
				msgs[i] = kafka.Message{Key: []byte(batch[i].Key), Value: batch[i].AppendEncode(nil)}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				t.Errorf("produce: %v", err)
			}
		}
		rr := rand.New(rand.NewPCG(seed+1, seed))
		for i := 0; i < len(evs); i += 500 {
			send(evs[i:min(i+500, len(evs))])
			if i > 0 && rr.IntN(3) == 0 { // a producer retry: part of a recent chunk again
				from := max(0, i-1000) + rr.IntN(500)
				send(evs[from : from+100])
				dups += 100
			}
			if i == 30_000 { // a replayed range
				send(evs[5_000:8_000])
				dups += 3_000
			}
			sent.Store(int64(i + 500))
			time.Sleep(120 * time.Millisecond)
		}
	}()

	procs := []*meterProc{startMeter(t, env), startMeter(t, env)}
	for _, p := range procs {
		waitStatus(t, p, http.StatusOK, 30*time.Second)
	}
	pause := func() { time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond) }
	kills := 0
	// Each restarted process is given time to join the group before the
	// next kill: kfake (unlike Kafka) was seen to keep a member killed
	// between JoinGroup and SyncGroup forever, leaving its partitions
	// unowned. The kills still land at random moments of the stream.
	restart := func(j int) {
		t.Logf("SIGKILL consumer %d after %d of %d events produced", j, sent.Load(), len(evs))
		procs[j].kill()
		kills++
		procs[j] = startMeter(t, env)
		waitStatus(t, procs[j], http.StatusOK, 60*time.Second)
	}
	for i := 0; i < 3; i++ {
		pause()
		restart(rng.IntN(len(procs)))
	}

	pause()
	t.Logf("stopping ClickHouse after %d of %d events produced", sent.Load(), len(evs))
	ch.Stop() // ClickHouse goes away mid-stream
	for _, p := range procs {
		waitStatus(t, p, http.StatusServiceUnavailable, 30*time.Second)
	}
	time.Sleep(time.Second)
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		waitStatus(t, p, http.StatusOK, 60*time.Second)
	}
	for i := 0; i < 2; i++ {
		pause()
		restart(rng.IntN(len(procs)))
	}

	produced.Wait()
	if t.Failed() {
		t.FailNow()
	}
	conn := ch.Conn(t)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 120*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var raw, distinct uint64
	if err := conn.QueryRow(ctx, "SELECT count(), uniqExact(event_id) FROM "+db+".decisions_raw").Scan(&raw, &distinct); err != nil {
		t.Fatal(err)
	}
	if raw != uint64(len(evs)) || distinct != uint64(len(evs)) {
		t.Fatalf("decisions_raw: %d rows, %d distinct ids; want %d of each", raw, distinct, len(evs))
	}
	t.Logf("%d distinct events, %d duplicates produced, %d consumer SIGKILLs, 1 ClickHouse restart: totals exact", len(evs), dups, kills)

	// Graceful stop: SIGTERM, exit 0 within 10 s.
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
			if p.err != nil {
				t.Errorf("meter-consumer exit after SIGTERM: %v", p.err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("meter-consumer did not stop within 10 s of SIGTERM")
		}
	}
}

// /readyz answers 503 with a JSON reason while ClickHouse or Kafka is
// unreachable.
func TestReadyzExplainsWhyNotReady(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	deadPort := func() string { return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) } // nothing listens
	cases := []struct {
		name, kafka, clickhouse, reason string
	}{
		{"clickhouse down", k.Addr(), deadPort(), "clickhouse"},
		{"kafka down", deadPort(), ch.Addr(), "consumer group"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startMeter(t, []string{"KAFKA_BROKERS=" + c.kafka, "CLICKHOUSE_ADDR=" + c.clickhouse, "CLICKHOUSE_DATABASE=" + ch.Database(t)})
			deadline := time.Now().Add(15 * time.Second)
			var last string
			for {
				resp, err := http.Get("http://" + p.addr + "/readyz")
				if err == nil {
					var body struct {
						Status  string            `json:"status"`
						Reasons map[string]string `json:"reasons"`
					}
					decErr := json.NewDecoder(resp.Body).Decode(&body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						t.Fatal("ready while a dependency is down")
					}
					last = fmt.Sprint(resp.StatusCode, body.Reasons, decErr)
					if resp.StatusCode == http.StatusServiceUnavailable && decErr == nil && strings.Contains(fmt.Sprint(body.Reasons), c.reason) {
						return
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no 503 naming %q from /readyz; last: %s %v", c.reason, last, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
