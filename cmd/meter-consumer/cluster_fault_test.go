package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// localQuery runs a one-column UInt64 query on one server and returns the
// values joined by ",".
func localQuery(t *testing.T, n *testenv.ClickHouse, q string) (string, error) {
	conn, err := n.Open()
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v uint64
		if err := rows.Scan(&v); err != nil {
			return "", err
		}
		out = append(out, fmt.Sprint(v))
	}
	return strings.Join(out, ","), rows.Err()
}

// TestExactTotalsOnTheClusterUnderFaults is TestExactTotalsUnderFaults on
// a 2 shards × 2 replicas ClickHouse (cluster mode): while a known set of
// events is produced (with producer retries and a replayed range), the two
// consumer processes are SIGKILLed and restarted, one replica of shard 1
// is stopped mid-stream (the shard's inserts go on to the other replica,
// and a consumer is killed while it is down, so progress is read from the
// survivor), and one replica of shard 2 is SIGKILLed. Then every rollup,
// read through the Distributed tables, holds exactly one count per
// distinct event; every replica holds the same rows as its sibling; and
// each shard holds only the Kafka partitions that chsink.ShardOf gives it.
// A tenth of the events are settles and some charges (withSettles): the
// actual cost read through the Distributed tables, and on every replica
// the same as its sibling's, equals the actual cost charged, exactly.
func TestExactTotalsOnTheClusterUnderFaults(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	c := testenv.StartClickHouseCluster(t, 2, 2)
	k := testenv.StartKafka(t, "ratelimit.decisions", 4)
	db := c.Database(t)
	reader := c.Shards[1][0] // CLICKHOUSE_ADDR: a node whose Distributed tables the checks read
	env := []string{
		"KAFKA_BROKERS=" + k.Addr(), "KAFKA_TOPIC=" + k.Topic(),
		"CLICKHOUSE_ADDR=" + reader.Addr(), "CLICKHOUSE_DATABASE=" + db,
		"CLICKHOUSE_CLUSTER=" + c.Name, "CLICKHOUSE_SHARDS=" + c.ShardsEnv(),
		"METER_BATCH_SIZE=1500", "METER_BATCH_WAIT=100ms",
		"METER_SESSION_TIMEOUT=6s", // as in TestExactTotalsUnderFaults
		"METER_STALL_AFTER=" + stallAfter.String(),
	}
	evs := withSettles(faultEvents(30_000))

	// Chunks of 150 every 120 ms: the stream outlasts the faults.
	prod := startProducer(t, seed, k.Addr(), k.Topic(), evs, 150)

	procs := []*meterProc{startMeter(t, env), startMeter(t, env)}
	for _, p := range procs {
		waitStatus(t, p, http.StatusOK, 60*time.Second)
	}
	pause := func() { time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond) }
	kills := 0
	kill := func(j int) {
		t.Logf("SIGKILL consumer %d after %d of %d events produced", j, prod.sent.Load(), len(evs))
		procs[j].kill()
		kills++
		procs[j] = startMeter(t, env)
	}
	allReady := func() {
		for _, p := range procs {
			waitStatus(t, p, http.StatusOK, 120*time.Second)
		}
	}

	pause()
	kill(rng.IntN(2))
	allReady()

	// One replica of shard 1 stops mid-stream; its sibling takes the inserts.
	pause()
	down := c.Shards[0][0]
	survivor := c.Shards[0][1]
	before, _ := localQuery(t, survivor, "SELECT count() FROM "+db+".decisions_raw_local")
	t.Logf("stopping replica 1 of shard 1 after %d of %d events produced (survivor holds %s rows)", prod.sent.Load(), len(evs), before)
	down.Stop()
	// Events produced now certainly arrive while it is down, whatever the
	// stream has done by then (some of their keys are on shard 1's
	// partitions).
	more := withSettles(faultEvents(3000))
	send(t, k.Addr(), k.Topic(), more)
	pause()
	kill(rng.IntN(2)) // its partitions' progress is read from the survivor
	// The survivor takes shard 1's inserts — unless the stopped replica
	// held parts the survivor had not copied yet (replication lags on a
	// loaded machine): then shard 1's partitions must wait for it, by
	// design (chsink: exactness before availability), and the survivor's
	// queue shows the fetches it waits for.
	took := false
	var waiting uint64
	deadline := time.Now().Add(testenv.Timeout(90 * time.Second))
	for time.Now().Before(deadline) {
		now, err := localQuery(t, survivor, "SELECT count() FROM "+db+".decisions_raw_local")
		var a, b uint64
		fmt.Sscan(before, &a)
		fmt.Sscan(now, &b)
		if err == nil && b > a {
			took = true
			break
		}
		q, err := localQuery(t, survivor, "SELECT count() FROM system.replication_queue WHERE database = '"+db+"' AND type = 'GET_PART'")
		if err == nil {
			fmt.Sscan(q, &waiting)
		}
		time.Sleep(500 * time.Millisecond)
	}
	switch {
	case took:
		t.Logf("shard 1's surviving replica took new rows while its sibling was down")
	case waiting > 0:
		t.Logf("shard 1 waits for its stopped replica: the survivor still has %d part(s) to fetch from it", waiting)
	default:
		t.Fatalf("shard 1's surviving replica took no new rows in 90 s while its sibling was down, and has no part to fetch that would explain it")
	}
	// Shard 2 loses a replica the hard way, while shard 1's is still down.
	t.Logf("SIGKILL replica 2 of shard 2 after %d of %d events produced", prod.sent.Load(), len(evs))
	c.Shards[1][1].Process().Kill()
	pause()
	if err := down.Start(); err != nil {
		t.Fatal(err)
	}
	pause()
	if err := c.Shards[1][1].Start(); err != nil {
		t.Fatal(err)
	}
	allReady()
	pause()
	kill(rng.IntN(2))
	allReady()

	dups := prod.wait()
	if t.Failed() {
		t.FailNow()
	}
	conn := reader.Conn(t)
	all := append(append([]metering.Event(nil), evs...), more...)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(all), 180*time.Second)
	waitRaw(t, conn, db, len(all), 60*time.Second)
	checkStatements(t, conn, db, all) // billing through the Distributed tables: docs/billing.md, "Tested"
	inCH := actualCostIn(t, conn, db, all)

	// Every replica holds its shard's rows, the same as its sibling; every
	// shard holds only its own partitions.
	for i, shard := range c.Shards {
		var own []string
		for p := 0; p < 4; p++ {
			if chsink.ShardOf(p, len(c.Shards)) == i {
				own = append(own, fmt.Sprint(p))
			}
		}
		for j, n := range shard {
			for _, table := range []string{"decisions_raw_local", "usage_minute_local", "usage_hour_local", "usage_day_local"} {
				q := "SELECT DISTINCT toUInt64(kafka_partition) AS p FROM " + db + "." + table + " WHERE key = '' ORDER BY p"
				if table == "decisions_raw_local" {
					q = "SELECT DISTINCT toUInt64(kafka_partition) AS p FROM " + db + "." + table + " ORDER BY p"
				}
				got, err := localQuery(t, n, q)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range strings.Split(got, ",") {
					if p != "" && !contains(own, p) {
						t.Fatalf("shard %d replica %d: %s holds partition %s; the shard owns %v", i+1, j+1, table, p, own)
					}
				}
			}
		}
		waitUntil(t, 120*time.Second, fmt.Sprintf("both replicas of shard %d to hold the same rows", i+1), func() bool {
			var got []string
			for _, n := range shard {
				s, err := localQuery(t, n, "SELECT count() FROM "+db+".decisions_raw_local")
				if err != nil {
					return false
				}
				for _, table := range testenv.RollupTables() {
					r, err := localQuery(t, n, "SELECT arrayJoin([sum(requests), sum(cost)]) FROM "+db+"."+table+"_local WHERE key != ''")
					if err != nil {
						return false
					}
					s += "/" + r
				}
				got = append(got, s)
			}
			sort.Strings(got)
			return got[0] == got[len(got)-1]
		})
	}
	t.Logf("%d distinct events (%d while a replica was down; %d settles and charges), %d duplicates produced, %d consumer SIGKILLs, a replica of each shard lost mid-stream: totals exact through the Distributed tables; actual cost in ClickHouse ÷ actual cost charged = %d ÷ %d = 1",
		len(all), len(more), len(all)-decisionsIn(all), dups, kills, inCH, costOf(all))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
