package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/ratewarden/ratewarden/metering/spool"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestSIGKILLLosesOnlyTheNewestDecisions: with Kafka unreachable, a
// limiter SIGKILLed mid-stream loses only what its writer had not yet
// appended to the spool (docs/spool.md, "On disk, and after a crash"),
// asserted in terms the code controls, not in a count the scheduler
// decides: one client makes decisions one after another, each on a key
// of its own (k0000, k0001, ...), so the order of decision is the order
// of emission; the test reads how many events the spool had taken
// (metering_spool_spooled_events_total), decides more, and kills the
// process at once. The spool then holds exactly the first n decisions for
// some n no smaller than what it had taken: nothing it took is lost, and
// what the kill lost is the newest decisions, never a gap among older
// ones.
func TestSIGKILLLosesOnlyTheNewestDecisions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	broker := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens
	p := startLimiter(t, spoolPolicy, "KAFKA_BROKERS="+broker, "LIMITER_SPOOL_DIR="+dir)
	decide := func(from, to int) {
		for i := from; i < to; i++ {
			if _, status := p.check(t, fmt.Sprintf("k%04d", i), "api:read", 1); status != 200 {
				t.Fatalf("/check %d answered %d", i, status)
			}
		}
	}
	const before, after = 300, 100
	decide(0, before)
	eventually(t, "the spool taking some of the decisions", func() bool {
		return p.metric(t, "metering_spool_spooled_events_total") > 0
	})
	taken := int(p.metric(t, "metering_spool_spooled_events_total"))
	decide(before, before+after)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done

	s, err := spool.Open(spool.Config{Dir: dir, MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rc := s.Recovered(); rc.Skipped != 0 {
		t.Logf("a torn last record skipped: %+v", rc) // a write cut by the kill: its events count as lost
	}
	held := map[int]bool{}
	for {
		recs, _, err := s.Read(1000, 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			i, err := strconv.Atoi(strings.TrimPrefix(string(r.Key), "k"))
			if err != nil || held[i] {
				t.Fatalf("spool record with key %q (held twice: %v)", r.Key, held[i])
			}
			held[i] = true
		}
	}
	n := len(held)
	for i := range n {
		if !held[i] {
			t.Fatalf("the spool holds %d decisions but not decision %d: a gap among older decisions", n, i)
		}
	}
	if n < taken {
		t.Fatalf("the spool holds %d decisions after the kill; it had taken %d before", n, taken)
	}
	t.Logf("%d decisions made, the spool had taken %d when read, holds the first %d after SIGKILL: %d lost, the newest",
		before+after, taken, n, before+after-n)
}
