package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const meteringPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 0.001, burst: 5 }
costs: { "api:search": 2 }
`

// TestDecisionsReachTheRollups is the product end to end: decisions through
// POST /check on the real limiter (Redis as the authority) are emitted to a
// Kafka-protocol broker, consumed by the real meter-consumer and rolled into
// ClickHouse, where the counts per key, scope and result equal what the
// limiter answered.
func TestDecisionsReachTheRollups(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 4)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)

	consumerBin := testenv.Binary(t, "cmd/meter-consumer")
	meterAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	consumer := exec.Command(consumerBin)
	consumer.Env = append(os.Environ(), "KAFKA_BROKERS="+k.Addr(), "CLICKHOUSE_ADDR="+ch.Addr(),
		"CLICKHOUSE_DATABASE="+db, "METER_ADDR="+meterAddr)
	logs := &syncBuffer{}
	consumer.Stderr = logs
	consumer.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		consumer.Process.Signal(syscall.SIGTERM)
		consumer.Wait()
		if t.Failed() {
			t.Logf("meter-consumer logs:\n%s", logs.String())
		}
	})

	p := startLimiter(t, meteringPolicy, "REDIS_ADDRS="+r.Addr(), "KAFKA_BROKERS="+k.Addr())
	want := map[testenv.UsageKey]testenv.UsageTotal{}
	send := func(key, scope string, n int) {
		for i := 0; i < n; i++ {
			d, status := p.check(t, key, scope, -1)
			if status != 200 {
				t.Fatalf("/check %s %s: %d", key, scope, status)
			}
			u := want[testenv.UsageKey{Key: key, Scope: scope}]
			u.Requests++
			if d.Allowed {
				u.Allowed++
				u.Cost += uint64(costOf(scope))
			} else {
				u.Rejected++
			}
			want[testenv.UsageKey{Key: key, Scope: scope}] = u
		}
	}
	send("acct_a", "api:read", 8)   // 5 allowed, 3 rejected
	send("acct_a", "api:search", 4) // cost 2 each: 2 allowed, 2 rejected
	send("acct_b", "api:read", 3)   // all allowed
	for k, u := range want {
		t.Logf("sent %s/%s: %+v", k.Key, k.Scope, u)
	}
	testenv.WaitUsageTotals(t, ch.Conn(t), db, want, 60*time.Second)

	resp, err := http.Get("http://" + meterAddr + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("meter-consumer readyz: %v %v", resp, err)
	}
	resp.Body.Close()
}

func costOf(scope string) int {
	if scope == "api:search" {
		return 2
	}
	return 1
}

// TestKafkaDownNeverBlocksDecisions: with the broker gone, every /check still
// answers, and the events that could not be buffered are counted as dropped.
// (Latency is compared in BENCHMARKS.md, not asserted here.)
func TestKafkaDownNeverBlocksDecisions(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	p := startLimiter(t, meteringPolicy, "REDIS_ADDRS="+r.Addr(), "KAFKA_BROKERS="+k.Addr(), "LIMITER_EMIT_BUFFER=256")
	k.Close()
	const n = 3000
	for i := 0; i < n; i++ {
		if _, status := p.check(t, fmt.Sprintf("acct_%d", i%50), "api:read", 1); status != 200 {
			t.Fatalf("/check %d answered %d with Kafka down", i, status)
		}
	}
	var dropped float64
	waitFor(t, "dropped events are counted", 10*time.Second, func() bool {
		dropped = p.metric(t, "metering_emitter_events_dropped_total")
		return dropped > 0
	})
	t.Logf("Kafka down: %d decisions answered, %.0f events counted as dropped (buffer 256)", n, dropped)
}
