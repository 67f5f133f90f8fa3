package chaudit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
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
		deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
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

// auditOnce runs a writer over l until it has caught up, then stops it.
func auditOnce(ctx context.Context, t *testing.T, l policylog.Log, conn driver.Conn, db string, keys ...*policylog.Keyring) {
	t.Helper()
	cfg := chaudit.Config{Log: l, Conn: conn, Database: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if len(keys) > 0 {
		cfg.Keys = keys[0]
	}
	aw, err := chaudit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- aw.Run(rctx) }()
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		if ok, _ := aw.Ready(); ok {
			break
		}
		if time.Now().After(deadline) {
			stop()
			<-done
			t.Fatal("the audit writer never caught up")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAuditLogStartsOver: a log that starts over at offset 0 (another
// incarnation of the topic: here another topic, as a fresh in-memory
// broker gives) is audited as a new epoch from its first record, both when
// it is shorter than what the table holds (restarted) and when it has grown
// past it (replaced); the old log's rows stay, and a restart of the writer
// writes nothing twice.
func TestAuditLogStartsOver(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	open := func(topic string) *kafkalog.Log {
		l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Topic: topic, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		if err := l.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	fill := func(l *kafkalog.Log, who string, overrides int) {
		c := policylog.NewClient(l, false)
		if _, err := c.Push(ctx, docA, who, "bootstrap", policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < overrides; i++ {
			if _, err := c.SetOverride(ctx, fmt.Sprintf("acct_%d", i), "", policy.Override{Tier: "pro", Reason: "deal"}, who, "", policylog.NoExpect); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, second, third := open("policy.first"), open("policy.second"), open("policy.third")
	fill(first, "alice", 3) // offsets 0..3
	fill(second, "bob", 1)  // offsets 0..1: ends below the 3 audited
	fill(third, "carol", 4) // offsets 0..4: grew past the 1 audited of the second
	auditOnce(ctx, t, first, conn, db)
	auditOnce(ctx, t, second, conn, db)
	auditOnce(ctx, t, second, conn, db) // the same log again: nothing twice
	auditOnce(ctx, t, third, conn, db)
	auditOnce(ctx, t, third, conn, db)

	rows, err := chaudit.Query(ctx, conn, db, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		pos, logOff int64
		epoch       uint32
		author      string
		rev         int64
	}
	var wants []want
	add := func(epoch uint32, base int64, n int, who string) {
		for i := 0; i < n; i++ {
			wants = append(wants, want{base + int64(i), int64(i), epoch, who, int64(i + 1)})
		}
	}
	add(0, 0, 4, "alice")
	add(1, 4, 2, "bob")
	add(2, 6, 5, "carol")
	if len(rows) != len(wants) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(wants), rows)
	}
	for i, w := range wants {
		r := rows[len(rows)-1-i] // Query is newest first
		if r.Offset != w.pos || r.LogOffset != w.logOff || r.Epoch != w.epoch || r.Author != w.author || r.Revision != w.rev || r.Result != policylog.Applied {
			t.Errorf("row %d: position %d, epoch %d, log offset %d, %s revision %d %s; want position %d, epoch %d, log offset %d, %s revision %d applied",
				i, r.Offset, r.Epoch, r.LogOffset, r.Author, r.Revision, r.Result, w.pos, w.epoch, w.logOff, w.author, w.rev)
		}
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".policy_audit").Scan(&n); err != nil || n != uint64(len(wants)) {
		t.Errorf("%d rows stored (%v), want %d", n, err, len(wants))
	}
}

// InForce rebuilds from policy_audit alone the document and overrides in
// force at an instant: before the first record nothing, between two pushes
// the first, after an override the override too, and on a log that started
// over, the new log's state.
func TestInForceFromTheAudit(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	open := func(topic string) *kafkalog.Log {
		l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Topic: topic, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		if err := l.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	// Records carry their writer's clock; these instants are set, not
	// waited for.
	base := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	write := func(l *kafkalog.Log, rec policylog.Record) {
		c := policylog.NewClient(l, false)
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(ctx, rec, policylog.NoExpect); err != nil {
			t.Fatal(err)
		}
	}
	docB := strings.Replace(docA, "rate: 100", "rate: 150", 1)
	first := open("policy.first")
	write(first, policylog.Record{Kind: policylog.KindPolicy, Document: docA, Author: "alice", Message: "a", Time: base})
	write(first, policylog.Record{Kind: policylog.KindPolicy, Document: docB, Author: "alice", Message: "b", Time: base.Add(10 * time.Minute)})
	write(first, policylog.Record{Kind: policylog.KindOverride, Key: "acct_1", Override: &policy.Override{Tier: "pro", Reason: "deal"}, Author: "billing", Message: "deal", Time: base.Add(20 * time.Minute)})
	auditOnce(ctx, t, first, conn, db)
	second := open("policy.second")
	write(second, policylog.Record{Kind: policylog.KindPolicy, Document: docA, Author: "bob", Message: "again", Time: base.Add(time.Hour)})
	auditOnce(ctx, t, second, conn, db)

	for _, c := range []struct {
		at        time.Duration
		head      int64
		epoch     uint32
		doc       string
		overrides int
	}{
		{-time.Minute, 0, 0, "", 0},
		{5 * time.Minute, 1, 0, docA, 0},
		{15 * time.Minute, 2, 0, docB, 0},
		{30 * time.Minute, 3, 0, docB, 1},
		{2 * time.Hour, 1, 1, docA, 0},
	} {
		st, epoch, err := chaudit.InForce(ctx, conn, db, base.Add(c.at))
		if err != nil {
			t.Fatal(err)
		}
		_, rec := st.Document()
		if st.Head() != c.head || epoch != c.epoch || rec.Document != c.doc || st.Overrides() != c.overrides {
			t.Errorf("in force at base%+v: head %d, epoch %d, %d overrides, document %q; want %d, %d, %d, %q",
				c.at, st.Head(), epoch, st.Overrides(), rec.Document, c.head, c.epoch, c.overrides, c.doc)
		}
	}
}

// TestInForceKeepsUnauthenticatedRefused: a record audited as
// unauthenticated (forged: unsigned, the next revision, its hash, a known
// author) stays refused when the state in force is rebuilt from the
// audit, which checks no signature itself.
func TestInForceKeepsUnauthenticatedRefused(t *testing.T) {
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
	signer, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	ring, err := policylog.ParseKeyring(strings.NewReader(signer.KeyringLine("alice")))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	w := policylog.NewClient(l, true)
	policylog.Keys{Signer: signer, Ring: ring}.Use(w)
	if _, err := w.Write(ctx, policylog.Record{Kind: policylog.KindPolicy, Document: docA, Message: "a", Time: base}, policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	forged := policylog.Record{Revision: 2, Parent: 1, Kind: policylog.KindPolicy, Document: strings.Replace(docA, "rate: 10,", "rate: 9999,", 1),
		Author: "alice", Message: "forged", Time: base.Add(time.Minute)}
	forged.Seal()
	v, _ := forged.Encode()
	if _, err := l.Append(ctx, policylog.DocumentKey, v); err != nil {
		t.Fatal(err)
	}
	auditOnce(ctx, t, l, conn, db, ring)
	var code, author string
	if err := conn.QueryRow(ctx, "SELECT code, author FROM "+db+".policy_audit FINAL WHERE message = 'forged'").Scan(&code, &author); err != nil || code != policylog.CodeUnauthenticated || author != "" {
		t.Fatalf("the forged record audited with code %q, author %q (%v)", code, author, err)
	}
	st, _, err := chaudit.InForce(ctx, conn, db, base.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, rec := st.Document(); st.Head() != 1 || rec.Document != docA {
		t.Fatalf("in force from the audit: head %d, document %q", st.Head(), rec.Document)
	}
}
