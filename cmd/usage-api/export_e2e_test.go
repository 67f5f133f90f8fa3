package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// stripeTap forwards to stripe-mock and notes each meter event's
// identifier; from the hold-th event on it forwards the request, then
// holds the answer until released (the exporter is killed meanwhile).
type stripeTap struct {
	proxy   *httputil.ReverseProxy
	mu      sync.Mutex
	ids     map[string]int
	n, hold int
	held    chan struct{} // closed when a request is held
	release chan struct{}
}

func (s *stripeTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	form, _ := url.ParseQuery(string(b))
	s.mu.Lock()
	s.n++
	s.ids[form.Get("identifier")]++
	holdThis := s.hold > 0 && s.n >= s.hold
	if holdThis && s.n == s.hold {
		close(s.held)
	}
	s.mu.Unlock()
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	if !holdThis {
		s.proxy.ServeHTTP(w, r)
		return
	}
	rec := httptestRecorder{header: http.Header{}}
	s.proxy.ServeHTTP(&rec, r) // stripe-mock has it: sent, not yet recorded by the exporter
	select {
	case <-s.release:
	case <-r.Context().Done():
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

type httptestRecorder struct {
	header http.Header
	code   int
}

func (r *httptestRecorder) Header() http.Header         { return r.header }
func (r *httptestRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *httptestRecorder) WriteHeader(code int)        { r.code = code }

// TestExportResumesAfterAKillAndBillsEveryRowOnce: a final month's totals
// of 60 keys go to Stripe (stripe-mock, through the official client); the
// exporter is SIGKILLed while Stripe has a meter event it has not
// recorded; run again, it sends only what its record lacks (the event in
// flight again, under the same identifier), and the record then holds
// every row exactly once. The CSV and JSON exports of the same month hold
// every statement line with the same identifiers each time.
func TestExportResumesAfterAKillAndBillsEveryRowOnce(t *testing.T) {
	t.Parallel()
	mock := testenv.StartStripeMock(t)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(conn, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	// October 2026 (final: more than the grace before now), 60 keys.
	base := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	var recs []chsink.Record
	for i := 0; i < 600; i++ {
		recs = append(recs, chsink.Record{Offset: int64(i), Event: metering.Event{EventID: fmt.Sprintf("x%06d", i),
			TS: base.Add(time.Duration(i) * time.Hour).UnixMilli(), Key: fmt.Sprintf("acct_%02d", i%60), Scope: []string{"api", "llm"}[i%2],
			Tier: "pro", Cost: uint64(1 + i%5), Allowed: true, Source: "shared", Policy: "p", Instance: "i"}})
	}
	p, err := sink.Progress(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, 0, recs, 599, &p); err != nil {
		t.Fatal(err)
	}

	tap := &stripeTap{ids: map[string]int{}, hold: 45, held: make(chan struct{}), release: make(chan struct{})}
	target, _ := url.Parse(mock)
	tap.proxy = httputil.NewSingleHostReverseProxy(target)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: tap}
	go srv.Serve(ln)
	t.Cleanup(func() { close(tap.release); srv.Close() })

	env := append(os.Environ(), "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db, "STRIPE_API_KEY=sk_test_123",
		"STRIPE_API_BASE=http://"+ln.Addr().String())
	export := func(args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bins, "usage-api"), append([]string{"export", "--period", "2026-10"}, args...)...)
		cmd.Env = env
		return cmd
	}
	first := export("--stripe")
	out := &syncBuffer{}
	first.Stdout, first.Stderr = out, out
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tap.held:
	case <-time.After(3 * time.Minute):
		_ = first.Process.Kill()
		t.Fatalf("the exporter never reached its 45th meter event: %s", out.String())
	}
	_ = first.Process.Kill()
	_ = first.Wait()
	tap.mu.Lock()
	tap.hold = 0 // the second run goes through
	tap.mu.Unlock()

	count := func() (rows, distinct uint64) {
		if err := conn.QueryRow(ctx, "SELECT count(), uniqExact(identifier) FROM "+db+".billing_exports WHERE destination = 'stripe'").Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		return rows, distinct
	}
	if rows, _ := count(); rows == 0 || rows >= 120 {
		t.Fatalf("after the kill the record holds %d rows; want some, not all", rows)
	}
	if b, err := export("--stripe").CombinedOutput(); err != nil {
		t.Fatalf("the export resumed: %v\n%s", err, b)
	}
	if rows, distinct := count(); rows != 120 || distinct != 120 {
		t.Fatalf("the record holds %d rows, %d identifiers; want each of the 120 (60 keys x requests, cost) once", rows, distinct)
	}
	tap.mu.Lock()
	twice := 0
	for id, n := range tap.ids {
		if n > 1 {
			twice++
		}
		if id == "" {
			t.Errorf("a meter event without an identifier")
		}
	}
	if len(tap.ids) != 120 || twice == 0 || twice > 20 {
		t.Errorf("stripe-mock saw %d identifiers, %d of them twice; want 120, the chunk in flight at the kill again (1 to 20)", len(tap.ids), twice)
	}
	tap.mu.Unlock()
	if b, err := export("--stripe").CombinedOutput(); err != nil || !strings.Contains(string(b), "sent 0 meter events") {
		t.Fatalf("a third run: %v %s", err, b)
	}

	// Files: every line (one scope per key here), the same identifiers on
	// every run.
	dir := t.TempDir()
	csvPath, jsonPath := filepath.Join(dir, "oct.csv"), filepath.Join(dir, "oct.json")
	for _, args := range [][]string{{"--csv", csvPath}, {"--json", jsonPath}, {"--csv", csvPath}} {
		if b, err := export(args...).CombinedOutput(); err != nil || !strings.Contains(string(b), "wrote 60 rows") {
			t.Fatalf("export %v: %v %s", args, err, b)
		}
	}
	f, err := os.Open(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := csv.NewReader(f).ReadAll()
	f.Close()
	var js []struct{ Identifier string }
	b, _ := os.ReadFile(jsonPath)
	if err != nil || len(lines) != 61 || json.Unmarshal(b, &js) != nil || len(js) != 60 || js[0].Identifier != lines[1][0] {
		t.Fatalf("csv %d lines (%v), json %d rows", len(lines), err, len(js))
	}
	if b, err := export("--csv", csvPath, "--period", "2026-12").CombinedOutput(); err == nil || !strings.Contains(string(b), "only a final period") {
		t.Fatalf("an open period exported: %v %s", err, b)
	}

	// The open month, hourly: one row per measure for the key with usage;
	// a second run in the same hour (or the next, with no new usage) sends
	// nothing; a closed month is refused.
	at := time.Now().UTC()
	open := at.Format("2006-01")
	now := []chsink.Record{{Offset: 600, Event: metering.Event{EventID: "now-1", TS: at.UnixMilli(), Key: "acct_now", Scope: "api",
		Tier: "pro", Cost: 3, Allowed: true, Source: "shared", Policy: "p", Instance: "i"}}}
	if p, err = sink.Progress(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, 0, now, 600, &p); err != nil {
		t.Fatal(err)
	}
	hourly := func() *exec.Cmd {
		cmd := exec.Command(filepath.Join(bins, "usage-api"), "export", "--period", open, "--stripe", "--hourly")
		cmd.Env = env
		return cmd
	}
	if b, err := hourly().CombinedOutput(); err != nil || !strings.Contains(string(b), "sent 2 hourly meter events of "+open) {
		t.Fatalf("the hourly export: %v %s", err, b)
	}
	if b, err := hourly().CombinedOutput(); err != nil || !strings.Contains(string(b), "sent 0 hourly meter events") {
		t.Fatalf("the hourly export again: %v %s", err, b)
	}
	var planned uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".billing_export_plans WHERE period = ? AND line = 'hourly' AND key = 'acct_now'", open).Scan(&planned); err != nil || planned != 2 {
		t.Fatalf("hourly rows planned: %d, %v; want 2", planned, err)
	}
	if b, err := export("--stripe", "--hourly").CombinedOutput(); err == nil || !strings.Contains(string(b), "only the open period") {
		t.Fatalf("a final month exported hourly: %v %s", err, b)
	}
}
