package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/policyctl"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The policy in force during the rollout tests: nothing is rejected at
// the traffic they send.
const rolloutBase = `version: 1
default_tier: free
tiers:
  free: { rate: 1000, burst: 1000 }
`

// rolloutSame decides every request as rolloutBase does.
const rolloutSame = rolloutBase + "# the same limits, reformatted\n"

// rolloutTight would reject all but the first request of each key.
const rolloutTight = `version: 1
default_tier: free
tiers:
  free: { rate: 0.001, burst: 1 }
`

// meterProc is a meter-consumer started for a test.
type meterProc struct {
	addr string
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

// startJudgingMeter runs the meter-consumer with the rollout judge on (a
// short settle and session: the tests wait for records, never for time).
func startJudgingMeter(t *testing.T, k *testenv.Kafka, ch *testenv.ClickHouse, db string, env ...string) *meterProc {
	t.Helper()
	m := &meterProc{addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), logs: &syncBuffer{}, done: make(chan struct{})}
	m.cmd = exec.Command(testenv.Binary(t, "cmd/meter-consumer"))
	m.cmd.Env = append(append(os.Environ(), "KAFKA_BROKERS="+k.Addr(), "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db,
		"METER_ADDR="+m.addr, "METER_BATCH_WAIT=50ms", "METER_SESSION_TIMEOUT=2s",
		"POLICY_JUDGE=true", "POLICY_JUDGE_SETTLE=2s"), env...)
	m.cmd.Stderr = m.logs
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.cmd.Wait(); close(m.done) }()
	testenv.FailOnRaceReport(t, "the meter-consumer", m.logs.String) // after the stop below
	t.Cleanup(func() {
		m.cmd.Process.Signal(syscall.SIGTERM)
		<-m.done
		if t.Failed() {
			t.Logf("meter-consumer %s logs:\n%s", m.addr, m.logs.String())
		}
	})
	waitFor(t, "meter-consumer ready", 90*time.Second, func() bool {
		select {
		case <-m.done:
			t.Fatalf("meter-consumer exited:\n%s", m.logs.String())
		default:
		}
		resp, err := http.Get("http://" + m.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return m
}

// metric is the value of the first sample of /metrics starting with
// prefix (-1 when there is none).
func (m *meterProc) metric(t *testing.T, prefix string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + m.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			var v float64
			fmt.Sscan(strings.TrimPrefix(line, prefix+" "), &v)
			return v
		}
	}
	return -1
}

// logged is one record of the policy log and what the apply rule made of
// it.
type logged struct {
	rec policylog.Record
	out policylog.Outcome
}

// readLog reads the whole policy log and applies it.
func readLog(t *testing.T, k *testenv.Kafka) ([]logged, *policylog.State) {
	t.Helper()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := policylog.NewState(true)
	var out []logged
	for {
		entries, end, err := l.Fetch(ctx, st.NextOffset())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Offset < st.NextOffset() {
				continue
			}
			o := st.Apply(e)
			out = append(out, logged{rec: o.Record, out: o})
		}
		if st.NextOffset() >= end {
			return out, st
		}
	}
}

// verdictsOf are the verdict records of rollout rev.
func verdictsOf(recs []logged, rev int64) []logged {
	var out []logged
	for _, r := range recs {
		if r.rec.Kind == policylog.KindVerdict && r.rec.Verdict != nil && r.rec.Verdict.Rollout == rev {
			out = append(out, r)
		}
	}
	return out
}

// pushRollout opens a rollout with the CLI and returns its revision.
func pushRollout(t *testing.T, env []string, doc, shadowFor, bound string) int64 {
	t.Helper()
	out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "cand.yaml", doc), "--shadow-for", shadowFor,
		"--max-newly-rejected", bound, "-m", "try "+shadowFor, "--author", "ops", "--json")
	var res policyctl.WriteResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Result != policylog.Applied {
		t.Fatalf("push --shadow-for: %d %q %q", code, out, errOut)
	}
	return res.Revision
}

// driveUntilVerdict sends decisions from a few keys to the limiters until
// rollout rev has a verdict applied in the log (bounded in count and
// time), and returns the log.
func driveUntilVerdict(t *testing.T, k *testenv.Kafka, fleet []*limiterProc, rev int64) []logged {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(120 * time.Second))
	for i := 0; i < 20000; i++ {
		p := fleet[i%len(fleet)]
		if _, code := p.check(t, fmt.Sprintf("acct_%d", i%7), "api:read", 1); code != 200 {
			t.Fatalf("/check: %d", code)
		}
		if i%50 == 49 {
			recs, _ := readLog(t, k)
			for _, v := range verdictsOf(recs, rev) {
				if v.out.Result == policylog.Applied {
					return recs
				}
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Fatalf("rollout %d: no verdict applied", rev)
	return nil
}

// TestRolloutPromotesAndWithdraws: on real traffic through two limiters,
// a candidate that decides as the policy in force is promoted, and one
// that would reject most decisions is withdrawn; each verdict is one
// record with the measured share, which every limiter applies, which
// history shows and policy_audit keeps.
func TestRolloutPromotesAndWithdraws(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "base.yaml", rolloutBase), "-m", "base"); code != 0 {
		t.Fatalf("push: %q %q", out, errOut)
	}
	meter := startJudgingMeter(t, k, ch, db)
	var fleet []*limiterProc
	for i := range 2 {
		fleet = append(fleet, startLimiter(t, rolloutBase, append(env, "REDIS_ADDRS="+r.Addr(), "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=",
			fmt.Sprintf("LIMITER_INSTANCE_ID=r%d", i))...))
	}

	// 1. The same limits: promoted. Each rollout runs long enough that a
	// busy machine's limiters apply it well before it ends: a rollout
	// that no limiter evaluated is withdrawn for want of evidence.
	const rolloutFor = "6s"
	rev := pushRollout(t, env, rolloutSame, rolloutFor, "0.5%")
	for _, p := range fleet {
		pol := waitRevision(t, p, int(rev))
		if ro, _ := pol["rollout"].(map[string]any); ro == nil || ro["revision"] != float64(rev) || ro["maxNewlyRejected"] != 0.005 {
			t.Fatalf("%s: /readyz policy during the rollout: %v", p.url, pol)
		}
	}
	recs := driveUntilVerdict(t, k, fleet, rev)
	vs := verdictsOf(recs, rev)
	if len(vs) != 1 || vs[0].rec.Verdict.Decision != policylog.Promote {
		t.Fatalf("rollout %d: verdicts %+v, want one promote", rev, vs)
	}
	v := vs[0].rec.Verdict
	t.Logf("rollout %d: %s, %d decisions, %d newly rejected (%v)", rev, v.Decision, v.Decisions, v.NewlyRejected, v.Reason)
	if v.Decisions == 0 || v.NewlyRejected != 0 || v.Share != 0 || v.MaxNewlyRejected != 0.005 {
		t.Fatalf("promote verdict: %+v", v)
	}
	promoted := vs[0].out.Head
	for _, p := range fleet {
		pol := waitRevision(t, p, int(promoted))
		if pol["rollout"] != nil {
			t.Errorf("%s: a rollout still shown after its verdict: %v", p.url, pol)
		}
	}
	out, _, code := runCLI(t, env, "policy", "show")
	if code != 0 || !strings.Contains(out, "# the same limits, reformatted") {
		t.Fatalf("after the promote, the document in force: %d %q", code, out)
	}

	// 2. A tight candidate: withdrawn, and the document stays.
	rev = pushRollout(t, env, rolloutTight, rolloutFor, "0.5%")
	for _, p := range fleet {
		waitRevision(t, p, int(rev))
	}
	recs = driveUntilVerdict(t, k, fleet, rev)
	vs = verdictsOf(recs, rev)
	if len(vs) != 1 || vs[0].rec.Verdict.Decision != policylog.Withdraw {
		t.Fatalf("rollout %d: verdicts %+v, want one withdraw", rev, vs)
	}
	v = vs[0].rec.Verdict
	t.Logf("rollout %d: %s, %d decisions, %d newly rejected (%v)", rev, v.Decision, v.Decisions, v.NewlyRejected, v.Reason)
	if v.Decisions == 0 || v.Share <= 0.005 || v.Share != float64(v.NewlyRejected)/float64(v.Decisions) {
		t.Fatalf("withdraw verdict: %+v", v)
	}
	for _, p := range fleet {
		waitRevision(t, p, int(vs[0].out.Head))
		if d, _ := p.check(t, "fresh-key", "api:read", 1); d.Limit != 1000 {
			t.Errorf("%s: after the withdraw, the limit is %d, want the promoted document's 1000", p.url, d.Limit)
		}
	}
	if n := meter.metric(t, `meter_rollout_verdicts_total{decision="withdraw",result="applied"}`); n != 1 {
		t.Errorf("meter_rollout_verdicts_total withdraw applied = %v", n)
	}
	if n := meter.metric(t, `meter_rollout_verdicts_total{decision="promote",result="applied"}`); n != 1 {
		t.Errorf("meter_rollout_verdicts_total promote applied = %v", n)
	}

	out, _, code = runCLI(t, env, "policy", "history")
	if code != 0 || !strings.Contains(out, "verdict promote rollout 2") || !strings.Contains(out, fmt.Sprintf("verdict withdraw rollout %d", rev)) ||
		!strings.Contains(out, "rollout (shadow "+rolloutFor+", max 0.5%)") {
		t.Errorf("history: %d\n%s", code, out)
	}
	// The rollup holds at least what the judge counted (events that came
	// after the verdict are in it too), and decisions_raw agrees with it.
	conn := ch.Conn(t)
	waitFor(t, "policy_audit holds both verdicts", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var n uint64
		err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".policy_audit FINAL WHERE kind = 'verdict' AND result = 'applied'").Scan(&n)
		return err == nil && n == 2
	})
	var decisions, newly, raw, rawNewly uint64
	waitFor(t, "rollout_shadow and decisions_raw agree", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := conn.QueryRow(ctx, "SELECT sum(decisions), sum(newly_rejected) FROM "+db+".rollout_shadow WHERE rollout = ?", rev).Scan(&decisions, &newly); err != nil {
			return false
		}
		if err := conn.QueryRow(ctx, "SELECT count(), countIf(allowed = 1 AND shadow_rejected = 1) FROM "+db+".decisions_raw WHERE shadow_revision = ?", rev).Scan(&raw, &rawNewly); err != nil {
			return false
		}
		return raw == decisions && rawNewly == newly
	})
	if decisions < v.Decisions || newly < v.NewlyRejected {
		t.Errorf("rollout_shadow %d/%d, decisions_raw %d/%d, the verdict counted %d/%d", decisions, newly, raw, rawNewly, v.Decisions, v.NewlyRejected)
	}
}

// TestRolloutJudgeKilledMidRollout: two meter-consumers run the judge;
// the one elected is SIGKILLed while the rollout is open, and the other,
// the consumer group's new owner of the policy topic, writes its one
// verdict.
func TestRolloutJudgeKilledMidRollout(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "base.yaml", rolloutBase), "-m", "base"); code != 0 {
		t.Fatalf("push: %q %q", out, errOut)
	}
	meters := []*meterProc{startJudgingMeter(t, k, ch, db), startJudgingMeter(t, k, ch, db)}
	leader := -1
	waitFor(t, "one judge elected", 60*time.Second, func() bool {
		n := 0
		for i, m := range meters {
			if m.metric(t, "meter_rollout_judge_leader") == 1 {
				leader, n = i, n+1
			}
		}
		return n == 1
	})
	successor := meters[1-leader]
	fleet := []*limiterProc{startLimiter(t, rolloutBase, append(env, "REDIS_ADDRS="+r.Addr(), "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")...)}

	// The window is long enough that the kill lands inside it on any
	// machine: the rollout's end is checked against the kill below.
	rev := pushRollout(t, env, rolloutSame, "15s", "0.5%")
	for i := 0; i < 50; i++ {
		fleet[0].check(t, fmt.Sprintf("acct_%d", i%5), "api:read", 1)
	}
	if err := meters[leader].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-meters[leader].done
	killedAt := time.Now()
	_, st := readLog(t, k)
	ro, open := st.Rollout()
	if !open || ro.Record.Revision != rev {
		t.Fatalf("after the kill, rollout %d is not open (the kill came too late to test anything)", rev)
	}
	t.Logf("judge %d killed %v before the rollout's end", leader, ro.Record.Rollout.EndsAt.Sub(killedAt).Round(time.Millisecond))

	recs := driveUntilVerdict(t, k, fleet, rev)
	waitFor(t, "the successor is the judge", 60*time.Second, func() bool { return successor.metric(t, "meter_rollout_judge_leader") == 1 })
	// A record after the verdict, read back: the log up to it holds every
	// verdict any judge wrote about the rollout.
	if out, errOut, code := runCLI(t, env, "override", "set", "acct_x", "--rate", "5", "--burst", "5", "--reason", "after the verdict"); code != 0 {
		t.Fatalf("override: %q %q", out, errOut)
	}
	recs, _ = readLog(t, k)
	vs := verdictsOf(recs, rev)
	if len(vs) != 1 || vs[0].out.Result != policylog.Applied || vs[0].rec.Verdict.Decision != policylog.Promote {
		t.Fatalf("rollout %d: %d verdicts %+v, want one promote applied", rev, len(vs), vs)
	}
	if want := fmt.Sprintf("/%d", successor.cmd.Process.Pid); !strings.HasSuffix(vs[0].rec.Author, want) {
		t.Errorf("the verdict's author is %q, want the successor (pid %s)", vs[0].rec.Author, want)
	}
	if n := successor.metric(t, `meter_rollout_verdicts_total{decision="promote",result="applied"}`); n != 1 {
		t.Errorf("the successor's promote verdicts applied: %v", n)
	}
}

// TestRolloutTwoVerdictsRace: two judges racing through a rebalance both
// write a verdict on the same head, and a third writes one after the
// first was applied. The apply rule takes the first alone: every limiter
// applies it and refuses the others, and policy_audit keeps all three.
func TestRolloutTwoVerdictsRace(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "base.yaml", rolloutBase), "-m", "base"); code != 0 {
		t.Fatalf("push: %q %q", out, errOut)
	}
	startJudgingMeter(t, k, ch, db, "POLICY_JUDGE=false") // the audit only: the verdicts are written below
	var fleet []*limiterProc
	for range 2 {
		fleet = append(fleet, startLimiter(t, rolloutBase, append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")...))
	}
	rev := pushRollout(t, env, rolloutSame, "1h", "0.5%")
	_, st := readLog(t, k)
	ro, ok := st.Rollout()
	if !ok {
		t.Fatal("no open rollout")
	}
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	verdict := func(revision, parent int64, decision, judge string) {
		rec := policylog.Record{Revision: revision, Parent: parent, Kind: policylog.KindVerdict, Author: judge, Message: decision + " by " + judge,
			Time: time.Now().UTC(), Verdict: &policylog.Verdict{Rollout: rev, Decision: decision, Decisions: 100, MaxNewlyRejected: 0.005}}
		if decision == policylog.Promote {
			rec.Document = ro.Record.Document
		}
		rec.Seal()
		b, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, rec.LogKey(), b); err != nil {
			t.Fatal(err)
		}
	}
	verdict(rev+1, rev, policylog.Promote, "judge-a")  // first: applied
	verdict(rev+1, rev, policylog.Withdraw, "judge-b") // the same head: a conflict
	verdict(rev+2, rev+1, policylog.Withdraw, "judge-c")

	for _, p := range fleet {
		pol := waitRevision(t, p, int(rev+1))
		if pol["rollout"] != nil {
			t.Errorf("%s: the rollout is still open: %v", p.url, pol)
		}
		waitFor(t, "both refusals counted", 30*time.Second, func() bool {
			return p.metric(t, `limiter_policy_log_records_total{code="conflict",result="refused"}`) == 2
		})
	}
	out, _, code := runCLI(t, env, "policy", "show")
	if code != 0 || !strings.Contains(out, "# the same limits, reformatted") || !strings.Contains(out, "by judge-a") {
		t.Errorf("the document in force: %d %q", code, out)
	}
	conn := ch.Conn(t)
	type row struct{ author, result, code, reason string }
	var rows []row
	waitFor(t, "three verdicts in policy_audit", 60*time.Second, func() bool {
		qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer qcancel()
		rs, err := conn.Query(qctx, "SELECT author, result, code, reason FROM "+db+".policy_audit FINAL WHERE kind = 'verdict' ORDER BY kafka_offset")
		if err != nil {
			return false
		}
		defer rs.Close()
		rows = rows[:0]
		for rs.Next() {
			var x row
			if rs.Scan(&x.author, &x.result, &x.code, &x.reason) == nil {
				rows = append(rows, x)
			}
		}
		return len(rows) == 3
	})
	if rows[0].author != "judge-a" || rows[0].result != policylog.Applied ||
		rows[1].author != "judge-b" || rows[1].result != policylog.Refused || rows[1].code != policylog.CodeConflict ||
		rows[2].author != "judge-c" || rows[2].result != policylog.Refused || rows[2].code != policylog.CodeConflict ||
		!strings.Contains(rows[2].reason, fmt.Sprintf("rollout %d was already closed at revision %d by judge-a", rev, rev+1)) {
		t.Errorf("policy_audit verdicts: %+v", rows)
	}
}

// A rollout's flags are checked before anything is written: exit 2.
func TestPushRolloutFlags(t *testing.T) {
	testenv.SkipShort(t) // runs the binary
	f := writeTemp(t, "p.yaml", rolloutBase)
	for _, args := range [][]string{
		{"policy", "push", f, "-m", "x", "--shadow-for", "15m"},                                // no bound
		{"policy", "push", f, "-m", "x", "--max-newly-rejected", "0.5%"},                       // no window
		{"policy", "push", f, "-m", "x", "--shadow-for", "15m", "--max-newly-rejected", "5"},   // above 1
		{"policy", "push", f, "-m", "x", "--shadow-for", "200h", "--max-newly-rejected", "1%"}, // too long
	} {
		if _, errOut, code := runCLI(t, []string{"KAFKA_BROKERS=127.0.0.1:1"}, args...); code != 2 || !strings.Contains(errOut, "a rollout needs") {
			t.Errorf("%v: exit %d %q", args, code, errOut)
		}
	}
}
