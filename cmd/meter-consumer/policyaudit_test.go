package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyAudit: meter-consumer is ready while the policy log does not
// exist, then writes each of its records, applied or refused, to
// policy_audit.
func TestPolicyAudit(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	p := startMeter(t, []string{"KAFKA_BROKERS=" + k.Addr(), "CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db})
	waitStatus(t, p, 200, 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n", "alice", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "policy", []byte("not a record")); err != nil {
		t.Fatal(err)
	}
	conn := ch.Conn(t)
	waitUntil(t, 60*time.Second, "two rows in policy_audit", func() bool {
		var applied, refused uint64
		err := conn.QueryRow(ctx, "SELECT countIf(result = 'applied' AND author = 'alice' AND revision = 1), countIf(result = 'refused' AND code = 'garbled') FROM "+db+".policy_audit FINAL").Scan(&applied, &refused)
		return err == nil && applied == 1 && refused == 1
	})
	waitStatus(t, p, 200, 30*time.Second)
}

// TestPolicyAuditUnauthenticated: with POLICY_TRUSTED_KEYS_FILE, a record
// forged with a plain Kafka client (the next revision, its content's hash,
// a known author) is audited as refused unauthenticated with no author,
// and a signed one as its key's identity's; the count is exported.
func TestPolicyAuditUnauthenticated(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	signer, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "keyring")
	if err := os.WriteFile(keys, []byte(signer.KeyringLine("alice")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startMeter(t, []string{"KAFKA_BROKERS=" + k.Addr(), "CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db,
		"POLICY_TRUSTED_KEYS_FILE=" + keys})
	waitStatus(t, p, 200, 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ring, err := policylog.LoadKeyring(keys)
	if err != nil {
		t.Fatal(err)
	}
	w := policylog.NewClient(l, true)
	policylog.Keys{Signer: signer, Ring: ring}.Use(w)
	if _, err := w.Push(ctx, "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n", "", "first", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}
	forged := policylog.Record{Revision: 2, Parent: 1, Kind: policylog.KindPolicy, Author: "alice", Message: "forged", Time: time.Now().UTC(),
		Document: "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 100000, burst: 100000 }\n"}
	forged.Seal()
	v, _ := forged.Encode()
	kw := &kafka.Writer{Addr: kafka.TCP(k.Addr()), Topic: kafkalog.DefaultTopic, RequiredAcks: kafka.RequireAll}
	defer kw.Close()
	if err := kw.WriteMessages(ctx, kafka.Message{Key: []byte(policylog.DocumentKey), Value: v}); err != nil {
		t.Fatal(err)
	}
	conn := ch.Conn(t)
	waitUntil(t, 60*time.Second, "the signed and the forged record in policy_audit", func() bool {
		var applied, refused uint64
		err := conn.QueryRow(ctx, "SELECT countIf(result = 'applied' AND author = 'alice' AND revision = 1), "+
			"countIf(result = 'refused' AND code = 'unauthenticated' AND author = '' AND revision = 2 AND message = 'forged') FROM "+db+".policy_audit FINAL").Scan(&applied, &refused)
		return err == nil && applied == 1 && refused == 1
	})
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), "\nmeter_policy_audit_unauthenticated_total 1\n") {
		t.Errorf("meter_policy_audit_unauthenticated_total is not 1")
	}
}
