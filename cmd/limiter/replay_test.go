package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// Refill of one token a minute: nothing that matters refills while the test
// runs, however slow the machine, so every verdict below is exact.
const recordedPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
  pro:  { rate: 1, period: minute, burst: 50 }
rules:
  - { name: search, scope: "api:search", rate: 1, period: minute, burst: 4 }
  - { name: search-trial, scope: "api:search", rate: 1, period: minute, burst: 2, shadow: true }
keys: { acct_pro: pro }
`

// The trial promoted, and a tighter limit for one customer.
const tighterPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
  pro:  { rate: 1, period: minute, burst: 50 }
rules:
  - { name: search-trial, scope: "api:search", rate: 1, period: minute, burst: 2 }
  - { name: acct3, key: acct_3, rate: 1, period: minute, burst: 2 }
keys: { acct_pro: pro }
`

type shadowDecision struct {
	decision
	Shadow *struct {
		Name       string `json:"name"`
		WouldAllow bool   `json:"wouldAllow"`
	} `json:"shadow"`
}

func checkShadow(t *testing.T, p *limiterProc, key, scope string) shadowDecision {
	t.Helper()
	resp, err := client.Post(p.url+"/check", "application/json", strings.NewReader(fmt.Sprintf(`{"key":%q,"scope":%q}`, key, scope)))
	if err != nil {
		t.Fatalf("POST /check: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var d shadowDecision
	if resp.StatusCode != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("/check %s %s: %d %s", key, scope, resp.StatusCode, b)
	}
	return d
}

// replayReport is the part of `limiter policy replay --json` the test reads.
type replayReport struct {
	Rows  int64 `json:"rows"`
	Total struct {
		Decisions, RecordedRejected, Rejected, NewlyRejected, NewlyAllowed int64
	} `json:"total"`
	Rules map[string]struct {
		Decisions, RecordedRejected, Rejected, NewlyRejected, NewlyAllowed int64
	} `json:"rules"`
	TopKeys []struct {
		Key                                string
		Decisions, Rejected, NewlyRejected int64
		RecordedRejected                   int64
		FirstLimited, FirstRecordedLimited time.Time
	} `json:"topKeys"`
	Agreement struct {
		Compared, Agree, DifferWithinTolerance, DifferBeyondTolerance int64
	} `json:"agreement"`
	FirstDifference string `json:"firstDifference"`
	Settlements     struct {
		Settles, SettlesUnmatched, Charges int64
	} `json:"settlements"`
	ActualCost  struct{ Recorded, Replayed int64 } `json:"actualCost"`
	QuotaResets int64                              `json:"quotaResets"`
}

func runReplayBin(t *testing.T, policyYAML string, env []string, from, to time.Time) replayReport {
	t.Helper()
	file := filepath.Join(t.TempDir(), "candidate.yaml")
	if err := os.WriteFile(file, []byte(policyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(limiterBin, "policy", "replay", file, "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--json", "--top", "20")
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("limiter policy replay: %v\n%s", err, stderr.String())
	}
	var rep replayReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("replay JSON: %v\n%s", err, out)
	}
	return rep
}

// TestReplayReproducesRecordedDecisions records real decisions through the
// running stack — two limiter processes sharing Redis (so the store, not
// only the local tier, rejects), a shadow rule beside enforcement, the
// Kafka-protocol broker, the real meter-consumer, ClickHouse — then replays
// them with `limiter policy replay`: under the policy that was in force it
// reproduces every recorded verdict (no recorded shared decision differs
// beyond the clock tolerance, and no decision is newly rejected or allowed);
// under a tighter candidate it reports more rejections for exactly the keys
// the candidate tightens, and the promoted shadow rule rejects in the replay
// what its shadow verdicts rejected live.
func TestReplayReproducesRecordedDecisions(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k, ch, db := startRecording(t, 4)

	env := []string{"REDIS_ADDRS=" + r.Addr(), "KAFKA_BROKERS=" + k.Addr(), "LIMITER_GRPC_ADDR=", storeDecides()}
	a := startLimiter(t, recordedPolicy, env...)
	b := startLimiter(t, recordedPolicy, env...)
	from := time.Now().Add(-time.Minute).Truncate(time.Second)

	want := map[testenv.UsageKey]testenv.UsageTotal{}
	var total, shared, shadowRejects int
	send := func(key, scope string, n int) {
		for i := 0; i < n; i++ {
			p := a
			if i%2 == 1 {
				p = b // alternate instances: the shared bucket runs dry before either local tier
			}
			d := checkShadow(t, p, key, scope)
			total++
			if d.Source == "shared" {
				shared++
			}
			u := want[testenv.UsageKey{Key: key, Scope: scope}]
			u.Requests++
			if d.Allowed {
				u.Allowed++
				u.Cost++
			} else {
				u.Rejected++
			}
			want[testenv.UsageKey{Key: key, Scope: scope}] = u
			if scope == "api:search" {
				// The trial (bucket 2) beside the enforced search rule (4).
				if d.Shadow == nil || d.Shadow.Name != "search-trial" || d.Shadow.WouldAllow != (i < 2) {
					t.Fatalf("%s search %d: shadow %+v, want search-trial wouldAllow=%v", key, i, d.Shadow, i < 2)
				}
				if d.Allowed != (i < 4) || d.Policy != "search" {
					t.Fatalf("%s search %d: enforced %+v, want the search rule's bucket of 4", key, i, d.decision)
				}
				shadowRejects++
				if d.Shadow.WouldAllow {
					shadowRejects--
				}
			} else if d.Shadow != nil {
				t.Fatalf("%s %s: a shadow verdict where no shadow rule applies: %+v", key, scope, d.Shadow)
			}
		}
	}
	for _, key := range []string{"acct_1", "acct_2", "acct_3", "acct_4"} {
		send(key, "api:read", 10)
	}
	send("acct_1", "api:search", 6)
	send("acct_2", "api:search", 6)
	send("acct_pro", "api:read", 10)
	if got := a.metric(t, `limiter_shadow_decisions_total{enforced="allowed",outcome="would_reject",shadow="search-trial"}`) +
		b.metric(t, `limiter_shadow_decisions_total{enforced="allowed",outcome="would_reject",shadow="search-trial"}`) +
		a.metric(t, `limiter_shadow_decisions_total{enforced="rejected",outcome="would_reject",shadow="search-trial"}`) +
		b.metric(t, `limiter_shadow_decisions_total{enforced="rejected",outcome="would_reject",shadow="search-trial"}`); int(got) != shadowRejects {
		t.Fatalf("shadow would_reject metric %v, want %d", got, shadowRejects)
	}
	// What enforcing the trial would newly reject: searches 3 and 4 of each
	// key, allowed by the bucket of 4, refused by the bucket of 2.
	if got := a.metric(t, `limiter_shadow_decisions_total{enforced="allowed",outcome="would_reject",shadow="search-trial"}`) +
		b.metric(t, `limiter_shadow_decisions_total{enforced="allowed",outcome="would_reject",shadow="search-trial"}`); got != 4 {
		t.Fatalf("shadow would_reject of allowed decisions %v, want 4", got)
	}
	testenv.WaitUsageTotals(t, ch.Conn(t), db, want, 60*time.Second)
	waitRaw(t, ch, db, total)
	to := time.Now().Add(time.Minute).Truncate(time.Second)
	chEnv := []string{"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db}

	same := runReplayBin(t, recordedPolicy, chEnv, from, to)
	t.Logf("same policy: %d rows, agreement %+v, total %+v", same.Rows, same.Agreement, same.Total)
	if same.Rows != int64(total) || same.Agreement.Compared != int64(shared) {
		t.Fatalf("replayed %d rows (%d shared), recorded %d (%d shared)", same.Rows, same.Agreement.Compared, total, shared)
	}
	if same.Agreement.DifferBeyondTolerance != 0 || same.Total.NewlyRejected != 0 || same.Total.NewlyAllowed != 0 {
		t.Fatalf("the policy in force does not reproduce the record: %+v %+v (%s)", same.Agreement, same.Total, same.FirstDifference)
	}

	tight := runReplayBin(t, tighterPolicy, chEnv, from, to)
	if table := replayTable(t, tighterPolicy, chEnv, from, to); !strings.Contains(table, "acct3") || !strings.Contains(table, "acct_3") {
		t.Fatalf("the table names neither the rule nor the key it tightens:\n%s", table)
	} else {
		t.Logf("the table for people:\n%s", table)
	}
	t.Logf("tighter: total %+v, rules %+v", tight.Total, tight.Rules)
	if tight.Total.Rejected <= same.Total.Rejected {
		t.Fatalf("the tighter policy rejects %d, the one in force %d", tight.Total.Rejected, same.Total.Rejected)
	}
	// The promoted trial rejects in the replay exactly what its shadow
	// verdicts rejected live.
	if st := tight.Rules["search-trial"]; st.Rejected != int64(shadowRejects) || st.NewlyRejected != 4 {
		t.Fatalf("search-trial in the replay %+v, shadow verdicts rejected %d live", st, shadowRejects)
	}
	if a3 := tight.Rules["acct3"]; a3.Decisions != 10 || a3.NewlyRejected != 3 {
		t.Fatalf("acct3 %+v, want 3 of 10 newly rejected (bucket 5 → 2)", a3)
	}
	for _, rule := range []string{"free", "pro"} {
		if c := tight.Rules[rule]; c.NewlyRejected != 0 || c.NewlyAllowed != 0 {
			t.Fatalf("rule %s is unchanged by the candidate, yet %+v", rule, c)
		}
	}
	newly := map[string]int64{}
	for _, k := range tight.TopKeys {
		newly[k.Key] = k.NewlyRejected
		if k.Key == "acct_3" && !k.FirstLimited.Before(k.FirstRecordedLimited) {
			t.Fatalf("acct_3 first limited %v under the candidate, %v then: want earlier", k.FirstLimited, k.FirstRecordedLimited)
		}
	}
	for key, n := range map[string]int64{"acct_1": 2, "acct_2": 2, "acct_3": 3, "acct_4": 0, "acct_pro": 0} {
		if newly[key] != n {
			t.Fatalf("%s newly rejected %d, want %d (top keys %+v)", key, newly[key], n, tight.TopKeys)
		}
	}
}

// startRecording starts what records decisions: a broker with the
// decisions topic in partitions, ClickHouse with a database of the test's
// own, and the real meter-consumer between them.
func startRecording(t *testing.T, partitions int) (*testenv.Kafka, *testenv.ClickHouse, string) {
	t.Helper()
	k := testenv.StartKafka(t, "ratelimit.decisions", partitions)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	startMeter(t, k, ch, db)
	return k, ch, db
}

// startMeter runs the real meter-consumer against the broker and ClickHouse.
func startMeter(t *testing.T, k *testenv.Kafka, ch *testenv.ClickHouse, db string) {
	t.Helper()
	bin := testenv.Binary(t, "cmd/meter-consumer")
	meterAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	c := exec.Command(bin)
	c.Env = append(os.Environ(), "KAFKA_BROKERS="+k.Addr(), "CLICKHOUSE_ADDR="+ch.Addr(),
		"CLICKHOUSE_DATABASE="+db, "METER_ADDR="+meterAddr, "METER_BATCH_WAIT=50ms")
	logs := &syncBuffer{}
	c.Stderr = logs
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Process.Signal(syscall.SIGTERM)
		c.Wait()
		if t.Failed() {
			t.Logf("meter-consumer logs:\n%s", logs.String())
		}
	})
	waitFor(t, "meter-consumer ready", 60*time.Second, func() bool {
		resp, err := http.Get("http://" + meterAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// waitRaw waits until decisions_raw holds n rows: its INSERT may land a
// moment after the rollups'.
func waitRaw(t *testing.T, ch *testenv.ClickHouse, db string, n int) {
	t.Helper()
	conn := ch.Conn(t)
	waitFor(t, fmt.Sprintf("%d rows in decisions_raw", n), 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var got uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".decisions_raw").Scan(&got); err != nil {
			return false
		}
		if got > uint64(n) {
			t.Fatalf("decisions_raw holds %d rows, more than the %d decisions", got, n)
		}
		return got == uint64(n)
	})
}

func replayTable(t *testing.T, policyYAML string, env []string, from, to time.Time) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "candidate.yaml")
	if err := os.WriteFile(file, []byte(policyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(limiterBin, "policy", "replay", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), file)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("limiter policy replay: %v\n%s", err, out)
	}
	return string(out)
}
