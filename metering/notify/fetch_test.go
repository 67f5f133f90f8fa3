package notify_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/notify"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// crossings: for each of n keys, 20 decisions up to a limit of 20 (warnings
// from the 16th), so n notifications to send.
func crossings(n int) []metering.Event {
	ids := metering.NewIDs()
	var evs []metering.Event
	for i := 0; i < n; i++ {
		evs = append(evs, decisions(ids, fmt.Sprintf("acct_f%02d", i), "api:search", 20, 20)...)
	}
	return evs
}

// A broker slower to answer a fetch than the fetch's old MaxWait (500 ms)
// must slow the notifier down, never stop it. kafka-go's Reader uses MaxWait
// as the socket deadline of the whole fetch, so with 500 ms every fetch
// answered 1 s late timed out, was retried at the same offset for ever, and
// nothing was ever read (the meter consumer's stall).
func TestNotifierFetchesSlowerThanOldMaxWaitStillProgress(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	rcv := newReceiver(t, func(int) int { return 204 })
	evs := crossings(8)
	produce(t, k.Addr(), k.Topic(), evs)
	restore := k.SlowFetches(time.Second) // twice the old deadline
	defer restore()
	r := startNotifier(t, conn, db, k, rcv.srv.URL, nil)
	// Each fetch costs 1 s and returns up to 1 MiB: a handful of fetches.
	waitFor(t, 120*time.Second, fmt.Sprintf("the %d events read through fetches answered 1 s late", len(evs)), func() bool {
		return metric(t, r.reg, "notifier_events_total", "") >= float64(len(evs))
	})
	waitFor(t, 60*time.Second, "the 8 crossings sent", func() bool {
		return metric(t, r.reg, "notifier_notifications_total", "sent") >= 8
	})
}

// A partition whose fetches get no answer is not a silent stall: every
// failed fetch is logged at WARN and counted (notifier_kafka_errors_total),
// and once the broker answers again every event is read. Before, kafka-go's
// Reader reported them only to its unset ErrorLogger.
func TestNotifierFailingFetchesAreLoggedAndCounted(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	rcv := newReceiver(t, func(int) int { return 204 })
	evs := crossings(8)
	produce(t, k.Addr(), k.Topic(), evs)
	release := k.HoldFetches(0)
	defer release()
	logs := &syncBuffer{}
	r := startNotifier(t, conn, db, k, rcv.srv.URL, func(c *notify.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	// A held fetch fails at the reader's deadline (5 s) after the group is
	// joined; the bound only covers a slow join on a loaded machine.
	waitFor(t, 120*time.Second, "a failed fetch of the held partition to be counted", func() bool {
		return metric(t, r.reg, "notifier_kafka_errors_total", "") >= 1
	})
	if !strings.Contains(logs.String(), `"msg":"notifier: kafka reader"`) {
		t.Fatalf("the failed fetch was counted but not logged; log:\n%s", logs.String())
	}
	if n := metric(t, r.reg, "notifier_events_total", ""); n >= float64(len(evs)) {
		t.Fatalf("%v events read while partition 0 was held: the hold did not hold", n)
	}
	release()
	waitFor(t, 120*time.Second, fmt.Sprintf("the %d events read once partition 0 is answered again", len(evs)), func() bool {
		return metric(t, r.reg, "notifier_events_total", "") >= float64(len(evs))
	})
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
