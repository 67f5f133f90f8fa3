package notify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/metering/notify"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var ch *testenv.ClickHouse

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(testenv.MainWithClickHouse(m, &ch))
}

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func setup(t *testing.T) (driver.Conn, string) {
	t.Helper()
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	return conn, db
}

// receiver is a real HTTP endpoint that verifies every signature.
type receiver struct {
	t       *testing.T
	key     []byte
	mu      sync.Mutex
	got     []received
	bad     int
	respond func(n int) int // status for the n-th request (1-based); 0 = hang until the test ends
	srv     *httptest.Server
	hang    chan struct{}
}

type received struct {
	id   string
	body map[string]any
}

func newReceiver(t *testing.T, respond func(n int) int) *receiver {
	key, _ := notify.ParseSecret(secret)
	r := &receiver{t: t, key: key, respond: respond, hang: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() { close(r.hang); r.srv.Close() })
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	if err := notify.Verify(r.key, req.Header, body, time.Now(), 5*time.Minute); err != nil {
		r.bad++
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var b map[string]any
	_ = json.Unmarshal(body, &b)
	r.got = append(r.got, received{id: req.Header.Get(notify.HeaderID), body: b})
	n := len(r.got)
	r.mu.Unlock()
	status := r.respond(n)
	if status == 0 {
		select {
		case <-r.hang:
		case <-req.Context().Done():
		}
		return
	}
	w.WriteHeader(status)
}

func (r *receiver) snapshot() ([]received, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...), r.bad
}

type runningNotifier struct {
	n      *notify.Notifier
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startNotifier(t *testing.T, conn driver.Conn, db string, k *testenv.Kafka, url string, mod func(*notify.Config)) *runningNotifier {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := notify.Config{
		Brokers: []string{k.Addr()}, Topic: k.Topic(), URL: url, Secret: secret,
		Retry: notify.Schedule{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond, Attempts: 6},
		// An attempt that timed out on a loaded machine would be one more
		// retry than the tests count: the deadline is for a hung receiver.
		AttemptTimeout: 30 * time.Second, SessionTimeout: 2 * time.Second, RecordEvery: 50 * time.Millisecond,
		Conn: conn, Database: db, Registry: reg,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if mod != nil {
		mod(&cfg)
	}
	n, err := notify.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningNotifier{n: n, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- n.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *runningNotifier) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(testenv.Timeout(20 * time.Second)):
			panic("notifier did not stop within 20 s")
		}
	})
}

func metric(t *testing.T, reg *prometheus.Registry, name string, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == label {
					match = true
				}
			}
			if match && m.GetCounter() != nil {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func produce(t *testing.T, addr, topic string, evs []metering.Event) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.Hash{}, BatchSize: 1000, BatchTimeout: time.Millisecond}
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

// decisions: n events of key/scope at now, remaining counting down from
// limit; warning from the decision where use reaches 80%.
func decisions(ids *metering.IDs, key, scope string, n int, limit int64) []metering.Event {
	out := make([]metering.Event, n)
	now := time.Now()
	for i := range out {
		rem := limit - int64(i+1)
		out[i] = metering.Event{EventID: ids.Next(now), TS: now.UnixMilli() + int64(i), Key: key, Scope: scope, Tier: "pro",
			Cost: 1, Allowed: rem >= 0, Source: "shared", Remaining: max(rem, 0), Limit: limit, Policy: "pro",
			Warning: float64(limit-rem) >= 0.8*float64(limit), Instance: "test"}
	}
	return out
}

// waitFor polls cond until it holds. The bounds given are generous: they
// are reached only when something is broken, never by a slow machine.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(within))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deliveries(t *testing.T, conn driver.Conn, db, key string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT outcome FROM "+db+".webhook_deliveries WHERE key = ? ORDER BY attempt", key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// TestOneCrossingOneDelivery: 20 warned decisions of one key and scope (a
// crossing, then more decisions above the soft limit) give exactly one
// signed delivery; another scope of the same key is its own crossing; a
// restart of the notifier that re-reads the topic sends nothing again.
func TestOneCrossingOneDelivery(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 4)
	rcv := newReceiver(t, func(int) int { return 204 })
	ids := metering.NewIDs()
	evs := decisions(ids, "acct_a", "api:search", 100, 100) // warnings from the 80th
	produce(t, k.Addr(), k.Topic(), evs)
	r := startNotifier(t, conn, db, k, rcv.srv.URL+"/hook?token=abc", nil)
	waitFor(t, 60*time.Second, "100 events read", func() bool { return metric(t, r.reg, "notifier_events_total", "") >= 100 })
	waitFor(t, 60*time.Second, "one delivery recorded", func() bool { return len(deliveries(t, conn, db, "acct_a")) == 1 })
	produce(t, k.Addr(), k.Topic(), decisions(ids, "acct_a", "api:write", 10, 10)) // another scope crosses at once
	waitFor(t, 60*time.Second, "110 events read", func() bool { return metric(t, r.reg, "notifier_events_total", "") >= 110 })
	waitFor(t, 60*time.Second, "two deliveries recorded", func() bool { return len(deliveries(t, conn, db, "acct_a")) == 2 })

	got, bad := rcv.snapshot()
	if len(got) != 2 || bad != 0 {
		t.Fatalf("receiver got %d deliveries (%d with a bad signature), want 2", len(got), bad)
	}
	first := got[0].body
	data, _ := first["data"].(map[string]any)
	if first["type"] != notify.EventType || data["key"] != "acct_a" || data["scope"] != "api:search" || data["tier"] != "pro" ||
		data["limit"] != 100.0 || data["remaining"] != 20.0 || data["percentUsed"] != 80.0 || data["policy"] != "pro" || first["timestamp"] == "" {
		t.Fatalf("body %v", first)
	}
	if got[0].id != "msg_"+evs[79].EventID {
		t.Fatalf("webhook-id %s, want msg_ + the crossing event's id", got[0].id)
	}
	// 21 warned decisions in api:search (80th to 100th), 3 in api:write.
	if sup := metric(t, r.reg, "notifier_notifications_total", "suppressed"); sup != 20+2 {
		t.Fatalf("suppressed %v, want 22", sup)
	}

	// Restart: the new member reads from the committed offsets or from the
	// start; the cool-downs restored from ClickHouse suppress any repeat.
	r.stop()
	r2 := startNotifier(t, conn, db, k, rcv.srv.URL+"/hook", func(c *notify.Config) { c.GroupID = "notifier-replay" })
	waitFor(t, 60*time.Second, "replay read", func() bool { return metric(t, r2.reg, "notifier_events_total", "") >= 110 })
	// Every one of the 24 warned decisions is decided before the check (a
	// fixed pause would pass early on a slow machine whatever was sent): a
	// replay must suppress them all and send nothing.
	waitFor(t, 60*time.Second, "the replay decided the 24 warnings", func() bool {
		return metric(t, r2.reg, "notifier_notifications_total", "") >= 24
	})
	if sent := metric(t, r2.reg, "notifier_notifications_total", "sent"); sent != 0 {
		t.Fatalf("the replay sent %v notifications again, want 0", sent)
	}
	if got, _ := rcv.snapshot(); len(got) != 2 {
		t.Fatalf("after a replay the receiver has %d deliveries, want still 2", len(got))
	}
}

// TestRetriedDeliveryIsRecorded: a receiver failing three times then
// succeeding gets one delivery in four attempts, all with the same
// webhook-id, and the operator reads the four attempts through the usage API.
func TestRetriedDeliveryIsRecorded(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 4)
	rcv := newReceiver(t, func(n int) int {
		if n <= 3 {
			return 503
		}
		return 200
	})
	nr := startNotifier(t, conn, db, k, rcv.srv.URL, nil)
	produce(t, k.Addr(), k.Topic(), decisions(metering.NewIDs(), "acct_r", "api:search", 10, 10))
	waitFor(t, 60*time.Second, "four attempts recorded", func() bool { return len(deliveries(t, conn, db, "acct_r")) == 4 })
	if ok, why := nr.n.Ready(); !ok {
		t.Fatalf("notifier not ready: %s", why)
	}
	if o := deliveries(t, conn, db, "acct_r"); fmt.Sprint(o) != "[retrying retrying retrying delivered]" {
		t.Fatalf("outcomes %v", o)
	}
	got, bad := rcv.snapshot()
	if len(got) != 4 || bad != 0 || got[0].id != got[3].id {
		t.Fatalf("receiver saw %d requests (%d badly signed), ids %q..%q", len(got), bad, got[0].id, got[len(got)-1].id)
	}

	// The operator's view.
	store, _ := usage.NewStore(conn, db)
	signer, _ := usage.NewSigner([]byte("0123456789abcdef0123"))
	srv, err := usage.New(usage.Config{Store: store, Signer: signer, AdminToken: "adm"})
	if err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(srv.Handler())
	defer h.Close()
	req, _ := http.NewRequest("GET", h.URL+"/v1/admin/webhook-deliveries?key=acct_r", nil)
	req.Header.Set("Authorization", "Bearer adm")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var view struct{ Attempts []usage.Delivery }
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil || resp.StatusCode != 200 || len(view.Attempts) != 4 {
		t.Fatalf("operator view: %d %+v %v", resp.StatusCode, view, err)
	}
	if a := view.Attempts[0]; a.Attempt != 4 || a.Outcome != "delivered" || a.StatusCode != 200 || a.URL != rcv.srv.URL || view.Attempts[3].StatusCode != 503 {
		t.Fatalf("newest attempt %+v", a)
	}
}

// TestHangingReceiverDoesNotSlowMetering: while every webhook hangs, the
// meter consumer (its own group) rolls up every event exactly, and the
// notifier itself keeps reading (dropping what it has no slot for).
func TestHangingReceiverDoesNotSlowMetering(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 4)
	rcv := newReceiver(t, func(int) int { return 0 })
	nr := startNotifier(t, conn, db, k, rcv.srv.URL, func(c *notify.Config) {
		c.MaxInFlight = 2
		c.AttemptTimeout = time.Hour
		c.Client = &http.Client{} // no client timeout either
	})

	reg := prometheus.NewRegistry()
	obs, err := consumer.InsertMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(conn, db, obs)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := consumer.New(consumer.Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), Sink: sink, Ping: conn.Ping,
		BatchSize: 1000, BatchWait: 100 * time.Millisecond, SessionTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	ids := metering.NewIDs()
	var evs []metering.Event
	want := map[testenv.UsageKey]testenv.UsageTotal{}
	for i := 0; i < 50; i++ {
		for _, e := range decisions(ids, fmt.Sprintf("acct_%02d", i), "api:search", 20, 20) {
			evs = append(evs, e)
			u := want[testenv.UsageKey{Key: e.Key, Scope: e.Scope}]
			u.Requests++
			u.Allowed++
			u.Cost++
			if e.Warning {
				u.Warnings++
			}
			want[testenv.UsageKey{Key: e.Key, Scope: e.Scope}] = u
		}
	}
	produce(t, k.Addr(), k.Topic(), evs)
	testenv.WaitUsageTotals(t, conn, db, want, 60*time.Second)
	waitFor(t, 60*time.Second, "the notifier read every event", func() bool {
		return metric(t, nr.reg, "notifier_events_total", "") >= float64(len(evs))
	})
	// Each key has 5 warned decisions; the 48 keys without a slot are
	// dropped at each of them (a later warning may still find a slot).
	got, _ := rcv.snapshot()
	if len(got) != 2 || metric(t, nr.reg, "notifier_notifications_total", "dropped") != 48*5 {
		t.Fatalf("hanging receiver holds %d requests, dropped %v; want 2 and 240", len(got), metric(t, nr.reg, "notifier_notifications_total", "dropped"))
	}
	// SIGTERM budget (CONTRACT: 10 s for the whole binary): the hanging
	// deliveries are abandoned after ShutdownGrace and recorded as such.
	t0 := time.Now()
	nr.stop()
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("notifier took %s to stop with hanging deliveries", d)
	} else {
		t.Logf("notifier stopped in %s with 2 hanging deliveries", d)
	}
	var abandoned uint64
	if err := conn.QueryRow(context.Background(), "SELECT count() FROM "+db+".webhook_deliveries WHERE outcome = 'abandoned'").Scan(&abandoned); err != nil || abandoned != 2 {
		t.Fatalf("abandoned attempts recorded: %d %v, want 2", abandoned, err)
	}
}
