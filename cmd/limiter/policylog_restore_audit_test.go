package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyRestoreFromAudit: a log audited by meter-consumer into
// clickhouse-server's policy_audit is lost (the cluster rebuilt, empty).
// A write on the empty log is refused, pointing to the restore (the audit
// holds an earlier history); `limiter policy restore --from-audit` writes
// the state back as epoch 1 with the digest the old log had, every
// override with its original author and message, and writes go on from
// it.
func TestPolicyRestoreFromAudit(t *testing.T) {
	t.Parallel()
	k, ch, db := startRecording(t, 1)
	chEnv := []string{"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db, "REDIS_STORES="}
	env := append([]string{"KAFKA_BROKERS=" + k.Addr()}, chEnv...)
	for _, args := range [][]string{
		{"policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--author", "alice", "--no-replay"},
		{"override", "set", "acct_1", "--tier", "pro", "--reason", "contract 2291", "--author", "billing"},
		{"override", "set", "acct_2", "--scope", "api:search", "--rate", "50", "--burst", "100", "--reason", "launch", "--author", "ops"},
		{"override", "set", "acct_3", "--tier", "pro", "--reason", "trial", "--author", "billing"},
		{"override", "delete", "acct_3", "--reason", "trial over", "--author", "billing"},
	} {
		if out, errOut, code := runCLI(t, env, args...); code != 0 {
			t.Fatalf("%v: %d %q %q", args, code, out, errOut)
		}
	}
	read := func(addr string) *policylog.State {
		t.Helper()
		l, err := kafkalog.New(kafkalog.Config{Brokers: []string{addr}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c := policylog.NewClient(l, true)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		return c.State()
	}
	old := read(k.Addr())
	if old.Head() != 5 || old.Overrides() != 2 {
		t.Fatalf("the old log: head %d, %d overrides", old.Head(), old.Overrides())
	}
	conn := ch.Conn(t)
	waitFor(t, "policy_audit holds the 5 records", 60*time.Second, func() bool {
		rows, err := chaudit.Query(context.Background(), conn, db, 0, 10)
		return err == nil && len(rows) == 5
	})

	// The cluster rebuilt: an empty broker.
	k2 := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env2 := append([]string{"KAFKA_BROKERS=" + k2.Addr()}, chEnv...)
	out, errOut, code := runCLI(t, env2, "override", "set", "acct_9", "--tier", "pro", "--reason", "x")
	if code != 1 || !strings.Contains(errOut, "policy_audit holds revision 5 of an earlier log") || !strings.Contains(errOut, "limiter policy restore --from-audit") {
		t.Fatalf("a write on the lost log: %d %q %q, want it refused, pointing to the restore", code, out, errOut)
	}
	out, errOut, code = runCLI(t, env2, "policy", "restore", "--from-audit", "-m", "cluster rebuilt", "--author", "ops")
	if code != 0 || !strings.Contains(out, "epoch 1: revision 5 restored with 2 overrides, digest "+old.Digest()) {
		t.Fatalf("restore --from-audit: %d %q %q, want revision 5, 2 overrides, digest %s", code, out, errOut, old.Digest())
	}
	st := read(k2.Addr())
	if st.Digest() != old.Digest() || st.Epoch() != 1 || st.Head() != 5 {
		t.Fatalf("the restored log: epoch %d, head %d, digest %s; want epoch 1, head 5, digest %s", st.Epoch(), st.Head(), st.Digest(), old.Digest())
	}
	for _, want := range old.OverrideRecords() {
		got, ok := st.Override(want.Key, want.Scope)
		if !ok || got.Author != want.Author || got.Message != want.Message || got.SHA256 != want.SHA256 {
			t.Fatalf("override %s: restored %+v, was %+v", want.Subject(), got, want)
		}
	}
	if _, ok := st.Override("acct_3", ""); ok {
		t.Fatal("the deleted override came back")
	}
	if out, errOut, code := runCLI(t, env2, "override", "set", "acct_4", "--tier", "pro", "--reason", "new", "--author", "billing"); code != 0 || !strings.Contains(out, "applied: revision 6") {
		t.Fatalf("a write after the restore: %d %q %q", code, out, errOut)
	}
}
