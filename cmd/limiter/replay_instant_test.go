package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// A refill fast enough that many decisions of a burst sit within a few ms
// of a bucket boundary: replayed at the limiter's clock (ts, before the
// store call) some go the other way; at the store's instant none may.
const burstyPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 20, burst: 4 }
`

// postCheck is one /check from any goroutine (no t.Fatal off the test's).
func postCheck(url, key string) (decision, error) {
	resp, err := client.Post(url+"/check", "application/json", strings.NewReader(fmt.Sprintf(`{"key":%q,"scope":"api:read"}`, key)))
	if err != nil {
		return decision{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var d decision
	if resp.StatusCode != 200 || json.Unmarshal(b, &d) != nil {
		return decision{}, fmt.Errorf("/check %s: %d %s", key, resp.StatusCode, b)
	}
	return d, nil
}

// TestReplayReproducesBurstyTrafficAtTheStoresInstant: bursts of
// concurrent requests from 6 keys through two limiter processes sharing
// Redis, recorded by the real meter-consumer into ClickHouse, then replayed
// under the same policy with `limiter policy replay`. Every shared decision
// carries the store's instant (decided_us), and at it the replay reproduces
// every recorded shared verdict: none differs, within the clock tolerance or
// beyond it. The verdicts do not depend on the machine's speed: whatever
// the timing, the replay decides each at the instant the store did.
func TestReplayReproducesBurstyTrafficAtTheStoresInstant(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k, ch, db := startRecording(t, 4)
	// Log mode: the policy is revision 1 of the policy log, which the
	// meter-consumer audits into policy_audit; the replay below without a
	// FILE takes the policy in force from there.
	// storeDecides: a degraded decision in a burst spends no shared
	// tokens, and the shared verdicts after it are then not what the
	// recorded ones alone reproduce.
	env := []string{"REDIS_ADDRS=" + r.Addr(), "KAFKA_BROKERS=" + k.Addr(), "LIMITER_GRPC_ADDR=", "POLICY_SOURCE=kafka",
		storeDecides()}
	pushed := filepath.Join(t.TempDir(), "pushed.yaml")
	if err := os.WriteFile(pushed, []byte(burstyPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	push := exec.Command(limiterBin, "policy", "push", pushed, "-m", "bursty", "--author", "test")
	push.Env = append(os.Environ(), "KAFKA_BROKERS="+k.Addr())
	if out, err := push.CombinedOutput(); err != nil {
		t.Fatalf("limiter policy push: %v\n%s", err, out)
	}
	a := startLimiter(t, burstyPolicy, env...)
	b := startLimiter(t, burstyPolicy, env...)
	for _, p := range []*limiterProc{a, b} {
		if pol := p.policyOf(t); pol["source"] != "kafka" || pol["revision"] != float64(1) {
			t.Fatalf("limiter policy: %v, want revision 1 from the log", pol)
		}
	}
	// The range starts at a whole second after the push (--from is RFC
	// 3339 seconds), so that revision 1 is in force at its start.
	from := time.Now().Add(time.Second).Truncate(time.Second)
	time.Sleep(time.Until(from))

	const keys, bursts, per = 6, 10, 6 // 360 decisions
	var mu sync.Mutex
	var total, shared, rejected int
	var firstErr error
	var wg sync.WaitGroup
	for ki := 0; ki < keys; ki++ {
		wg.Add(1)
		go func(key string) {
			defer wg.Done()
			for burst := 0; burst < bursts; burst++ {
				var bw sync.WaitGroup
				for j := 0; j < per; j++ {
					p := a
					if j%2 == 1 {
						p = b
					}
					bw.Add(1)
					go func(url string) {
						defer bw.Done()
						d, err := postCheck(url, key)
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							if firstErr == nil {
								firstErr = err
							}
							return
						}
						total++
						if d.Source == "shared" {
							shared++
						}
						if !d.Allowed {
							rejected++
						}
					}(p.url)
				}
				bw.Wait()
				// About the time two or three tokens take to come back.
				time.Sleep(time.Duration(90+30*(burst%3)) * time.Millisecond)
			}
		}(fmt.Sprintf("acct_burst_%d", ki))
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("%d decisions, %d shared, %d rejected", total, shared, rejected)
	if rejected == 0 || shared == 0 {
		t.Fatalf("the bursts should have emptied shared buckets: %d rejected, %d shared of %d", rejected, shared, total)
	}
	waitRaw(t, ch, db, total)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var withInstant, sharedRows, atRev1 uint64
	if err := ch.Conn(t).QueryRow(ctx, "SELECT countIf(decided_us IS NOT NULL), countIf(source = 'shared'), countIf(policy_revision = 1) FROM "+db+".decisions_raw").Scan(&withInstant, &sharedRows, &atRev1); err != nil {
		t.Fatal(err)
	}
	if sharedRows != uint64(shared) || withInstant != sharedRows || atRev1 != uint64(total) {
		t.Fatalf("decisions_raw: %d shared rows, %d with decided_us, %d at revision 1; want %d, all, %d", sharedRows, withInstant, atRev1, shared, total)
	}
	to := time.Now().Add(time.Minute).Truncate(time.Second)
	rep := runReplayBin(t, burstyPolicy, []string{"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db}, from, to)
	t.Logf("replay under the policy in force: %d rows, agreement %+v, total %+v", rep.Rows, rep.Agreement, rep.Total)
	if rep.Rows != int64(total) || rep.Agreement.Compared != int64(shared) {
		t.Fatalf("replayed %d rows (%d shared), recorded %d (%d shared)", rep.Rows, rep.Agreement.Compared, total, shared)
	}
	// Without a FILE: the policy in force at --from, from policy_audit.
	waitFor(t, "revision 1 in policy_audit", 60*time.Second, func() bool {
		var n uint64
		err := ch.Conn(t).QueryRow(ctx, "SELECT count() FROM "+db+".policy_audit WHERE revision = 1 AND result = 'applied'").Scan(&n)
		return err == nil && n == 1
	})
	cmd := exec.Command(limiterBin, "policy", "replay", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--json")
	cmd.Env = append(os.Environ(), "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db)
	out, err := cmd.Output()
	var audited struct {
		Candidate string `json:"candidate"`
		replayReport
	}
	if err != nil || json.Unmarshal(out, &audited) != nil {
		t.Fatalf("limiter policy replay without FILE: %v\n%s", err, out)
	}
	t.Logf("replay under %s: agreement %+v", audited.Candidate, audited.Agreement)
	if !strings.Contains(audited.Candidate, "revision 1") || audited.Rows != rep.Rows || audited.Agreement != rep.Agreement {
		t.Fatalf("replay under the audited revision: %s, %d rows, %+v; want revision 1, %d rows, %+v", audited.Candidate, audited.Rows, audited.Agreement, rep.Rows, rep.Agreement)
	}
	if rep.Agreement.Agree != rep.Agreement.Compared {
		if rs, err := ch.Conn(t).Query(ctx, "SELECT key, ts, decided_us, source, allowed, remaining, instance FROM "+db+".decisions_raw WHERE source != 'shared' ORDER BY key, ts"); err == nil {
			for rs.Next() {
				var ts uint64
				var us *int64
				var key, src, inst string
				var al uint8
				var rem int64
				_ = rs.Scan(&key, &ts, &us, &src, &al, &rem, &inst)
				t.Logf("NONSHARED %s ts %d %s allowed=%d remaining=%d %s", key, ts, src, al, rem, inst)
			}
			rs.Close()
		}
		if rs, err := ch.Conn(t).Query(ctx, "SELECT ts, decided_us, source, allowed, remaining, instance FROM "+db+".decisions_raw WHERE key = ? ORDER BY ifNull(decided_us, toInt64(ts)*1000), remaining DESC, allowed DESC", firstKey(rep.FirstDifference)); err == nil {
			for rs.Next() {
				var ts uint64
				var us *int64
				var src, inst string
				var al uint8
				var rem int64
				_ = rs.Scan(&ts, &us, &src, &al, &rem, &inst)
				u := int64(0)
				if us != nil {
					u = *us
				}
				t.Logf("ts %d decided %d (+%d us) %s allowed=%d remaining=%d %s", ts, u, u-int64(ts)*1000, src, al, rem, inst)
			}
			rs.Close()
		}
		t.Fatalf("the policy in force does not reproduce every shared verdict: %+v (%s)", rep.Agreement, rep.FirstDifference)
	}
}

// firstKey is the key named in a replay's first difference ("... key K scope ...").
func firstKey(diff string) string {
	_, after, _ := strings.Cut(diff, " key ")
	k, _, _ := strings.Cut(after, " ")
	return k
}
