package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// A broker slower to answer a fetch than the fetch's MaxWait (an overloaded
// broker, or any broker on an overloaded machine) must slow the consumer
// down, never stop it. kafka-go's Reader uses MaxWait as the socket deadline
// of the whole fetch, so with the 100 ms it was given every such fetch
// timed out, was retried silently at the same offset, and the partition
// stopped for good.
func TestFetchesSlowerThanMaxWaitStillProgress(t *testing.T) {
	t.Parallel() // mostly waiting (slow fetches, the watchdog's clock), on its own broker and database
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	evs := events(3000)
	produce(t, k.Addr(), k.Topic(), evs)
	restore := k.SlowFetches(400 * time.Millisecond) // 4× the consumer's MaxWait
	defer restore()
	startConsumer(t, conn, db, k.Addr(), k.Topic(), 700)
	// Each fetch costs 400 ms: a few dozen fetches at most.
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 120*time.Second)
}

// stallAfter is the watchdog's clock in these tests: short enough for a
// quick test, and far above any pause of a healthy partition on a loaded
// machine (a batch of 700 events is written in milliseconds to seconds).
const stallAfter = 15 * time.Second

// A partition whose fetches get no answer while it has lag is a stall: the
// watchdog counts it, /readyz (Ready) names the partition, and the partition
// gets a fresh reader; once the broker answers again the totals are exact,
// the consumer is ready, and no other partition ever counted a stall.
func TestWatchdogCountsAndRecoversAStalledPartition(t *testing.T) {
	t.Parallel() // mostly waiting (slow fetches, the watchdog's clock), on its own broker and database
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	evs := events(4000)
	release := k.HoldFetches(1)
	defer release()
	r := startConsumerWith(t, conn, db, k.Addr(), k.Topic(), 700, stallAfter)
	produce(t, k.Addr(), k.Topic(), evs)

	// stallAfter of no progress, after joining the group: the generous
	// bound only covers a slow join on a loaded machine.
	waitFor(t, stallAfter+120*time.Second, "a stall of partition 1 to be counted", func() bool {
		return stalls(t, r.reg)["1"] >= 1
	})
	waitFor(t, 30*time.Second, "Ready to name partition 1 as stalled", func() bool {
		ok, why := r.c.Ready()
		return !ok && strings.Contains(why, "partition 1") && strings.Contains(why, "stalled")
	})
	release()
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 120*time.Second)
	waitFor(t, 30*time.Second, "Ready after partition 1 made progress again", func() bool {
		ok, _ := r.c.Ready()
		return ok
	})
	if n := stalls(t, r.reg)["0"]; n != 0 {
		t.Fatalf("partition 0 (never held) counted %v stalls, want 0", n)
	}
}

// A healthy run with the same short watchdog clock never counts a stall.
func TestWatchdogQuietWhenHealthy(t *testing.T) {
	t.Parallel() // mostly waiting (slow fetches, the watchdog's clock), on its own broker and database
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	evs := events(4000)
	r := startConsumerWith(t, conn, db, k.Addr(), k.Topic(), 700, stallAfter)
	produce(t, k.Addr(), k.Topic(), evs[:2000])
	produce(t, k.Addr(), k.Topic(), evs[2000:])
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 120*time.Second)
	for p, n := range stalls(t, r.reg) {
		if n != 0 {
			t.Fatalf("partition %s counted %v stalls in a healthy run", p, n)
		}
	}
}

// stalls returns meter_partition_stalls_total by partition.
func stalls(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "meter_partition_stalls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// waitFor polls cond until it holds, failing with what it waited for after
// within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(within))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
