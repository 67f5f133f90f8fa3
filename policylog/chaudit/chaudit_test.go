package chaudit_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/schema"
)

const docA = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n  pro: { rate: 100, burst: 200 }\n"

// TestAuditEveryRecord: applied and refused records (a conflict in the
// log, a garbled value) all reach policy_audit once, with the result every
// limiter decided, also across a restart of the writer.
func TestAuditEveryRecord(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, docA, "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	// A record that lost a race (written straight, parent 0 while the head is 1).
	stale := policylog.Record{Revision: 1, Parent: 0, Kind: policylog.KindPolicy, Document: docA + "# b\n", Author: "bob", Message: "stale", Time: time.Now()}
	stale.Seal()
	v, _ := stale.Encode()
	if _, err := l.Append(ctx, "policy", v); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "policy", []byte("{garbled")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.SetOverride(ctx, "acct_1", "", policy.Override{Tier: "pro", Reason: "deal"}, "billing", "", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	run := func() {
		aw, err := chaudit.New(chaudit.Config{Log: l, Conn: conn, Database: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- aw.Run(rctx) }()
		deadline := time.Now().Add(60 * time.Second)
		for {
			if ok, _ := aw.Ready(); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the audit writer never caught up")
			}
			time.Sleep(50 * time.Millisecond)
		}
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	run()
	run() // a restart writes nothing twice
	rows, err := chaudit.Query(ctx, conn, db, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ result, code, author string }{
		{policylog.Applied, "", "billing"},
		{policylog.Refused, policylog.CodeGarbled, ""},
		{policylog.Refused, policylog.CodeConflict, "bob"},
		{policylog.Applied, "", "alice"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Result != w.result || r.Code != w.code || r.Author != w.author {
			t.Errorf("row %d: %s %s %q, want %s %s %q", i, r.Result, r.Code, r.Author, w.result, w.code, w.author)
		}
	}
	if rows[3].Content == "" || rows[3].Revision != 1 || rows[0].Subject != "override acct_1" || rows[1].Content != "{garbled" {
		t.Errorf("rows: %+v", rows)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".policy_audit").Scan(&n); err != nil || n != 4 {
		t.Errorf("%d rows stored (%v), want 4: a restart wrote some twice", n, err)
	}
}
