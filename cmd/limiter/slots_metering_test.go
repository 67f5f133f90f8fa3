package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const slotsMeteringPolicy = `
version: 1
default_tier: reports
priorities: { critical: 1, default: 1, sheddable: 0.5 }
tiers:
  reports: { concurrency: 2 }
  both: { rate: 0.001, burst: 3, concurrency: 2 }
  rated: { rate: 0.001, burst: 2 }
`

// TestSlotDecisionsReachSlotsMinute is the slot record end to end: slots
// taken, shed, refused and released through POST /check and /release on
// the real limiter (Redis) are emitted to a Kafka-protocol broker,
// consumed by the real meter-consumer into ClickHouse, where slots_minute
// holds them per scope and class with the peak in flight, and the usage
// rollups count every /check once: a concurrency alone's by its slot
// decision, a limit with a rate's by its rate decision. A rate's shed (its
// class's floor) is counted with its class's sheds too.
func TestSlotDecisionsReachSlotsMinute(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	consumer := exec.Command(testenv.Binary(t, "cmd/meter-consumer"))
	consumer.Env = append(os.Environ(), "KAFKA_BROKERS="+k.Addr(), "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db,
		fmt.Sprintf("METER_ADDR=127.0.0.1:%d", testenv.FreePort(t)))
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
	p := startLimiter(t, slotsMeteringPolicy, "REDIS_ADDRS="+r.Addr(), "KAFKA_BROKERS="+k.Addr(), storeDecides())
	check := func(body, want string) map[string]any {
		t.Helper()
		code, d := p.post(t, "/check", body)
		if got := fmt.Sprint(d["allowed"], " ", d["reason"]); code != 200 || got != want {
			t.Fatalf("/check %s: %d %v, want %s", body, code, d, want)
		}
		return d
	}
	// A concurrency alone of 2, of which sheddable may hold 1.
	first := check(`{"key":"acct","scope":"export","priority":"sheddable"}`, "true <nil>")
	check(`{"key":"acct","scope":"export","priority":"sheddable"}`, "false shed")
	check(`{"key":"acct","scope":"export"}`, "true <nil>")
	check(`{"key":"acct","scope":"export","priority":"critical"}`, "false concurrency")
	for i, want := range []bool{true, false} { // the second release frees nothing: no event
		if code, d := p.post(t, "/release", `{"lease":"`+first["lease"].(string)+`"}`); code != 200 || d["released"] != want {
			t.Fatalf("release %d: %d %v", i, code, d)
		}
	}
	// A rate (burst 3) beside a concurrency of 2: the third is allowed by
	// its rate and refused a slot; the fourth refused by its rate.
	for _, want := range []string{"true <nil>", "true <nil>", "false concurrency", "false <nil>"} {
		check(`{"key":"acct","scope":"report","tier":"both"}`, want)
	}

	// A rate alone (burst 2), of which sheddable may leave no less than 1.
	check(`{"key":"acct","scope":"rated","tier":"rated","priority":"sheddable"}`, "true <nil>")
	check(`{"key":"acct","scope":"rated","tier":"rated","priority":"sheddable"}`, "false shed")

	testenv.WaitUsageTotals(t, ch.Conn(t), db, map[testenv.UsageKey]testenv.UsageTotal{
		{Key: "acct", Scope: "export"}: {Requests: 4, Allowed: 2, Rejected: 2, Cost: 2},
		{Key: "acct", Scope: "report"}: {Requests: 4, Allowed: 3, Rejected: 1, Cost: 3},
		{Key: "acct", Scope: "rated"}:  {Requests: 2, Allowed: 1, Rejected: 1, Cost: 1},
	}, 60*time.Second)
	want := map[string]string{
		"export/sheddable": "taken 1 refused 0 shed 1 released 0 peak 1",
		"export/default":   "taken 1 refused 0 shed 0 released 0 peak 2",
		"export/critical":  "taken 0 refused 1 shed 0 released 0 peak 2",
		"export/":          "taken 0 refused 0 shed 0 released 1 peak 0",
		"report/default":   "taken 2 refused 1 shed 0 released 0 peak 2",
		"rated/sheddable":  "taken 0 refused 0 shed 1 released 0 peak 0",
	}
	conn := ch.Conn(t)
	var got map[string]string
	err := testenv.Poll(60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rows, err := conn.Query(ctx, "SELECT scope, priority, sum(taken), sum(refused), sum(shed), sum(released), max(peak_in_flight)"+
			" FROM "+db+".slots_minute WHERE key = 'acct' GROUP BY scope, priority")
		if err != nil {
			return false
		}
		defer rows.Close()
		got = map[string]string{}
		for rows.Next() {
			var scope, class string
			var taken, refused, shed, released, peak uint64
			if rows.Scan(&scope, &class, &taken, &refused, &shed, &released, &peak) != nil {
				return false
			}
			got[scope+"/"+class] = fmt.Sprintf("taken %d refused %d shed %d released %d peak %d", taken, refused, shed, released, peak)
		}
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
	if err != nil {
		t.Fatalf("slots_minute: %v, want %v (%v)", got, want, err)
	}
}
