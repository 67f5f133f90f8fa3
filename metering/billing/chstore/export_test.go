package chstore_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/stripesend"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// stripeTap forwards meter events to stripe-mock and notes each
// identifier's values. While failing, it forwards a request (Stripe has
// the event) and answers 503 (the exporter does not know it): an export
// stopped between a send and its record.
type stripeTap struct {
	proxy   *httputil.ReverseProxy
	mu      sync.Mutex
	values  map[string][]string // identifier -> the payload values sent under it
	failing bool
}

func (s *stripeTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	form, _ := url.ParseQuery(string(b))
	s.mu.Lock()
	id := form.Get("identifier")
	s.values[id] = append(s.values[id], form.Get("payload[value]"))
	failing := s.failing
	s.mu.Unlock()
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	if !failing {
		s.proxy.ServeHTTP(w, r)
		return
	}
	s.proxy.ServeHTTP(&discard{header: http.Header{}}, r)
	w.WriteHeader(http.StatusServiceUnavailable)
}

func (s *stripeTap) fail(on bool) { s.mu.Lock(); s.failing = on; s.mu.Unlock() }

type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

func startTap(t *testing.T) (*stripeTap, string) {
	t.Helper()
	target, err := url.Parse(testenv.StartStripeMock(t))
	if err != nil {
		t.Fatal(err)
	}
	tap := &stripeTap{proxy: httputil.NewSingleHostReverseProxy(target), values: map[string][]string{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: tap}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return tap, "http://" + ln.Addr().String()
}

// sinkLog publishes a correction's events into the pipeline's sink, as
// the meter-consumer does with what it reads from the decisions log (the
// log itself is tested in cmd/meter-consumer).
type sinkLog struct {
	t  *testing.T
	pl *pipeline
}

func (l sinkLog) Publish(_ context.Context, evs []metering.Event) error {
	l.pl.write(l.t, evs...)
	return nil
}

// exported sums the export's record of destination stripe in period per
// key and measure, and counts its rows and identifiers.
func exported(t *testing.T, pl *pipeline, period string) (sums map[[2]string]int64, rows, ids uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pl.conn.QueryRow(ctx, "SELECT count(), uniqExact(identifier) FROM "+pl.db+".billing_exports WHERE destination = 'stripe' AND period = ?",
		period).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	r, err := pl.conn.Query(ctx, "SELECT key, measure, sum(if(measure = 'cost', cost, requests)) FROM "+pl.db+".billing_exports"+
		" WHERE destination = 'stripe' AND period = ? GROUP BY key, measure", period)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sums = map[[2]string]int64{}
	for r.Next() {
		var k, m string
		var v int64
		if err := r.Scan(&k, &m, &v); err != nil {
			t.Fatal(err)
		}
		sums[[2]string{k, m}] = v
	}
	return sums, rows, ids
}

// TestHourlyExportOfTheOpenPeriodBillsEveryUnitOnce: the open month is
// exported hourly to Stripe (stripe-mock through the official client),
// one row per key, measure and hour with the usage since the rows
// before; a run stopped after Stripe had a row and before the export
// recorded it resends that row with the same identifier and the same
// value, though more usage arrived meanwhile; a void of a range already
// exported lowers the final remainder. Once the month is final, the
// final export sends each key's totals less its hourly rows: the record
// then sums to each final statement exactly, every identifier once, and
// no identifier was ever sent with two values.
func TestHourlyExportOfTheOpenPeriodBillsEveryUnitOnce(t *testing.T) {
	t.Parallel()
	pl := newPipeline(t)
	tap, base := startTap(t)
	snd, err := stripesend.New(stripesend.Config{APIKey: "sk_test_123", URL: base, Timeout: testenv.Timeout(20 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	now := utc("2026-03-10T05:20:00Z")
	st := &billing.Statements{Store: pl.store, Grace: 72 * time.Hour, Now: func() time.Time { return now }}
	x := &billing.Exporter{Statements: st, Store: pl.store, Chunk: 2}
	corr := &billing.Corrector{Store: pl.store, Log: sinkLog{t, pl}, Now: func() time.Time { return now }}
	march, err := billing.ParsePeriod("2026-03", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(3*time.Minute))
	defer cancel()
	at := func(s string, n int, key string, cost uint64) {
		for i := 0; i < n; i++ {
			pl.write(t, ev(key, "api", utc(s).Add(time.Duration(i)*time.Second), cost, true))
		}
	}
	sendOpen := func(want int) {
		t.Helper()
		n, err := x.SendOpen(ctx, march, nil, "stripe", snd)
		if err != nil || n != want {
			t.Fatalf("hourly export at %s: sent %d, %v; want %d", now.Format(time.RFC3339), n, err, want)
		}
	}

	at("2026-03-02T10:00:00Z", 10, "acct_a", 2)
	at("2026-03-03T10:00:00Z", 5, "acct_b", 3)
	sendOpen(4) // requests and cost of both keys
	at("2026-03-10T05:30:00Z", 2, "acct_a", 2)
	sendOpen(0) // one row per key, measure and hour: the next hour sends it

	now = utc("2026-03-10T06:10:00Z")
	at("2026-03-10T06:00:00Z", 3, "acct_a", 2)
	tap.fail(true)
	if n, err := x.SendOpen(ctx, march, nil, "stripe", snd); err == nil || n != 0 {
		t.Fatalf("the export while Stripe's answers are lost: sent %d, %v", n, err)
	}
	tap.fail(false)
	at("2026-03-10T06:20:00Z", 1, "acct_a", 2) // after the rows were planned: the next hour's
	sendOpen(2)                                // the two rows of acct_a planned, under their values

	// A void of a range the hourly rows billed: the month's total falls,
	// and nothing is sent until the usage is above what was sent.
	now = utc("2026-03-12T00:10:00Z")
	from, to := utc("2026-03-02T10:00:00Z"), utc("2026-03-02T11:00:00Z")
	if _, _, err := corr.Apply(ctx, billing.Request{ID: "void-a", Key: "acct_a", From: &from, To: &to, Reason: "test traffic"}, "alice"); err != nil {
		t.Fatal(err)
	}
	sendOpen(0)
	if _, _, err := x.Send(ctx, march, nil, "stripe", snd); err == nil || !strings.Contains(err.Error(), "only a final period") {
		t.Fatalf("the final export of an open month: %v", err)
	}

	now = utc("2026-04-05T00:00:00Z") // final
	if _, err := x.SendOpen(ctx, march, nil, "stripe", snd); err == nil {
		t.Fatal("an hourly export of a final month was accepted")
	}
	sent, refused, err := x.Send(ctx, march, nil, "stripe", snd)
	if err != nil {
		t.Fatal(err)
	}
	// acct_a: hourly rows sent 15 requests (10, 5) and 30 cost, its
	// final totals 6 and 12 (16 and 32 less the void's 10 and 20): both
	// remainders negative, refused (a credit note). acct_b: remainders
	// of 0.
	if sent != 2 || len(refused) != 2 || refused[0].Key != "acct_a" || refused[0].Value() != -9 || refused[1].Value() != -18 {
		t.Fatalf("the final export sent %d, refused %+v", sent, refused)
	}
	sums, rows, ids := exported(t, pl, "2026-03")
	if rows != ids || rows != 8 {
		t.Fatalf("the record holds %d rows, %d identifiers; want 8 (4 + 2 hourly, 2 final), each once", rows, ids)
	}
	for _, k := range []string{"acct_a", "acct_b"} {
		s, err := st.Get(ctx, k, march, false)
		if err != nil {
			t.Fatal(err)
		}
		var owed billing.Totals
		for _, r := range refused {
			if r.Key == k && r.Measure == billing.MeasureCost {
				owed.Cost = -r.Value()
			} else if r.Key == k {
				owed.Requests = -r.Value()
			}
		}
		got := billing.Totals{Requests: sums[[2]string{k, "requests"}] - owed.Requests, Cost: sums[[2]string{k, "cost"}] - owed.Cost}
		if got != s.Totals {
			t.Errorf("%s: Stripe was sent %+v less the credit note %+v; the final statement is %+v", k, sums, owed, s.Totals)
		}
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	twice := 0
	for id, vs := range tap.values {
		for _, v := range vs[1:] {
			if v != vs[0] {
				t.Errorf("identifier %s sent with values %v", id, vs)
			}
		}
		if len(vs) > 1 {
			twice++
		}
	}
	if len(tap.values) != 8 || twice == 0 {
		t.Errorf("stripe-mock saw %d identifiers, %d more than once; want 8, the rows whose answers were lost again", len(tap.values), twice)
	}
	if n, refusedAgain, err := x.Send(ctx, march, nil, "stripe", snd); err != nil || n != 0 || len(refusedAgain) != 2 {
		t.Fatalf("the final export again: %d sent, %d refused, %v", n, len(refusedAgain), err)
	}
}
