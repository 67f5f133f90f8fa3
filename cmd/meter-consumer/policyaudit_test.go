package main

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
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
