package notify_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestNotifierAcrossALogThatStartsOver: the notifier's committed offsets
// belong to one log. The topic is deleted and created again while the
// notifier is stopped, once grown past the committed offsets (the old
// offsets would skip the new log's first messages) and once shorter than
// them (the old offsets would wait past its end for ever), then again while
// it runs. Every crossing of every log is sent exactly once: none skipped,
// none twice.
func TestNotifierAcrossALogThatStartsOver(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 2)
	rcv := newReceiver(t, func(int) int { return 204 })
	ids := metering.NewIDs()
	round := func(r, keys int) []metering.Event {
		var evs []metering.Event
		for i := 0; i < keys; i++ {
			evs = append(evs, decisions(ids, fmt.Sprintf("acct_r%d_%02d", r, i), "api:search", 20, 20)...)
		}
		return evs
	}
	recreate := func() {
		t.Helper()
		if err := k.Cluster().DeleteTopic(k.Topic()); err != nil {
			t.Fatal(err)
		}
		if err := k.Cluster().CreateTopic(k.Topic(), 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	sent := func(what string) {
		t.Helper()
		waitFor(t, 120*time.Second, what, func() bool {
			got, _ := rcv.snapshot()
			return len(got) >= want
		})
		time.Sleep(2 * time.Second) // room for a notification sent twice
		got, bad := rcv.snapshot()
		perKey := map[string]int{}
		for _, g := range got {
			data, _ := g.body["data"].(map[string]any)
			key, _ := data["key"].(string)
			perKey[key]++
		}
		for key, n := range perKey {
			if n != 1 {
				t.Errorf("%s: %s notified %d times", what, key, n)
			}
		}
		if len(got) != want || bad != 0 {
			t.Fatalf("%s: %d webhooks received (%d badly signed), want %d", what, len(got), bad, want)
		}
	}

	produce(t, k.Addr(), k.Topic(), round(0, 4)) // 80 events
	want += 4
	r := startNotifier(t, conn, db, k, rcv.srv.URL, nil)
	sent("the first log's 4 crossings")
	r.stop() // commits and checkpoints what it decided

	recreate()
	produce(t, k.Addr(), k.Topic(), round(1, 8)) // 160 events: past the committed offsets
	want += 8
	r = startNotifier(t, conn, db, k, rcv.srv.URL, nil)
	sent("a recreated log grown past the committed offsets: its 8 crossings")
	r.stop()

	recreate()
	produce(t, k.Addr(), k.Topic(), round(2, 1)) // 20 events: below the committed offsets
	want++
	r = startNotifier(t, conn, db, k, rcv.srv.URL, nil)
	sent("a recreated log shorter than the committed offsets: its crossing")

	recreate() // while the notifier runs
	produce(t, k.Addr(), k.Topic(), round(3, 6))
	want += 6
	sent("a log recreated under the running notifier: its 6 crossings")
	if n := metric(t, r.reg, "notifier_log_epochs_total", ""); n < 1 {
		t.Errorf("notifier_log_epochs_total = %v after a log started over under it", n)
	}
}
