package main

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// Refill of one token a minute: nothing refills while the test runs, so
// every verdict is exact however slow the machine.
const pushInForce = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
  pro:  { rate: 1, period: minute, burst: 50 }
`

// The candidate cuts free's burst from 5 to 2.
const pushCandidate = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 2 }
  pro:  { rate: 1, period: minute, burst: 50 }
`

// pushJSON is the part of `policy push --json` the tests read.
type pushJSON struct {
	Result   string `json:"result"`
	Revision int64  `json:"revision"`
	Preview  *struct {
		Status        string  `json:"status"`
		Reason        string  `json:"reason"`
		Decisions     int64   `json:"decisions"`
		NewlyRejected int64   `json:"newlyRejected"`
		Share         float64 `json:"newlyRejectedShare"`
		Recorded      uint64  `json:"recorded"`
		Sample        float64 `json:"sample"`
		Capped        bool    `json:"capped"`
		Rules         []struct {
			Name          string `json:"name"`
			NewlyRejected int64  `json:"newlyRejected"`
		} `json:"rules"`
		TopKeys []struct {
			Key           string `json:"key"`
			Decisions     int64  `json:"decisions"`
			NewlyRejected int64  `json:"newlyRejected"`
		} `json:"topKeys"`
	} `json:"preview"`
}

func decodePush(t *testing.T, out string) pushJSON {
	t.Helper()
	var r pushJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("push --json: %v\n%s", err, out)
	}
	return r
}

// TestPushPreviewsRecordedTraffic records decisions through the real stack
// (a limiter in log mode, kfake, meter-consumer, ClickHouse), then pushes a
// candidate that halves the free tier: before writing, push replays the
// last hour and names what it would newly reject — the free keys' allowed
// decisions beyond the new burst, not the key an override keeps on pro.
// With ClickHouse stopped, the next push says so and is applied anyway.
func TestPushPreviewsRecordedTraffic(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k, ch, db := startRecording(t, 2)
	env := []string{"KAFKA_BROKERS=" + k.Addr(), "CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db, "REDIS_STORES="}
	// A deadline no loaded machine reaches for 20 rows: the counts below
	// are of the whole window, not of a partial replay.
	slow := "--replay-timeout=45s"

	out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", pushInForce), "-m", "in force", "--author", "alice", slow)
	if code != 0 || !strings.Contains(out, "applied: revision 1") || !strings.Contains(out, "newly rejected: 0 of 0 decisions") {
		t.Fatalf("first push: %d %q %q", code, out, errOut)
	}
	if out, errOut, code = runCLI(t, env, "override", "set", "acct_1", "--tier", "pro", "--reason", "deal"); code != 0 {
		t.Fatalf("override: %d %q %q", code, out, errOut)
	}
	p := startLimiter(t, logBootstrap, "REDIS_ADDRS="+r.Addr(), "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")
	waitRevision(t, p, 2)

	// acct_1 (pro by override): 8 allowed. acct_2: 5 allowed, 3 rejected.
	// acct_3: 4 allowed. Under the candidate, acct_2 and acct_3 keep 2.
	total := 0
	for key, n := range map[string]int{"acct_1": 8, "acct_2": 8, "acct_3": 4} {
		for i := range n {
			d, status := p.check(t, key, "api", 1)
			total++
			if want := key == "acct_1" || i < 5; status != 200 || d.Allowed != want {
				t.Fatalf("%s #%d: %d %+v, want allowed=%v", key, i, status, d, want)
			}
		}
	}
	waitRaw(t, ch, db, total)

	cand := writeTemp(t, "b.yaml", pushCandidate)
	out, errOut, code = runCLI(t, env, "policy", "push", cand, "-m", "cut free", "--author", "bob", slow)
	t.Logf("push with the preview:\n%s%s", out, errOut)
	if code != 0 || !strings.Contains(out, "applied: revision 3") {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	if !strings.Contains(out, fmt.Sprintf("newly rejected: 5 of %d decisions (25.00%%)", total)) {
		t.Fatalf("the preview does not count 5 of %d newly rejected:\n%s", total, out)
	}
	for _, want := range []string{"acct_2", "acct_3", "free"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the preview does not name %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "acct_1") {
		t.Fatalf("the preview names acct_1, which its override keeps on pro:\n%s", out)
	}
	if strings.Index(out, "newly rejected:") > strings.Index(out, "applied:") {
		t.Fatalf("the preview comes after the write:\n%s", out)
	}

	// The same, as JSON (the candidate is pushed again: revision 4).
	out, errOut, code = runCLI(t, env, "policy", "push", cand, "-m", "again", "--json", slow)
	res := decodePush(t, out)
	pv := res.Preview
	if code != 0 || res.Result != "applied" || pv == nil || pv.Status != "replayed" {
		t.Fatalf("push --json: %d %+v %q", code, res, errOut)
	}
	if pv.Decisions != int64(total) || pv.NewlyRejected != 5 || pv.Share != 0.25 || pv.Sample != 1 || pv.Capped {
		t.Fatalf("preview %+v", pv)
	}
	if len(pv.TopKeys) != 2 || pv.TopKeys[0].Key != "acct_2" || pv.TopKeys[0].NewlyRejected != 3 || pv.TopKeys[1].Key != "acct_3" || pv.TopKeys[1].NewlyRejected != 2 {
		t.Fatalf("top keys %+v, want acct_2 (3) then acct_3 (2)", pv.TopKeys)
	}
	if len(pv.Rules) != 1 || pv.Rules[0].Name != "free" || pv.Rules[0].NewlyRejected != 5 {
		t.Fatalf("rules %+v", pv.Rules)
	}

	// A row budget below the window's rows samples keys and says so.
	out, _, code = runCLI(t, env, "policy", "push", cand, "-m", "budget", "--json", "--replay-max-rows", "5", slow)
	if res := decodePush(t, out); code != 0 || res.Preview == nil || res.Preview.Recorded != uint64(total) ||
		res.Preview.Sample >= 1 || res.Preview.Decisions > 5 {
		t.Fatalf("push with a budget of 5 rows: %d %+v", code, res.Preview)
	}
	out, _, code = runCLI(t, env, "policy", "push", cand, "-m", "quick", "--no-replay")
	if code != 0 || strings.Contains(out, "newly rejected") {
		t.Fatalf("--no-replay: %d %q", code, out)
	}

	ch.Stop()
	out, errOut, code = runCLI(t, env, "policy", "push", writeTemp(t, "c.yaml", pushInForce), "-m", "back", "--json")
	if code != 0 || !strings.Contains(errOut, "replay skipped") || !strings.Contains(errOut, "pushing without a preview") {
		t.Fatalf("push with ClickHouse stopped: %d %q %q", code, out, errOut)
	}
	if res := decodePush(t, out); res.Result != "applied" || res.Preview == nil || res.Preview.Status != "unavailable" {
		t.Fatalf("push with ClickHouse stopped: %+v", res)
	}
	waitRevision(t, p, 7)
}

// TestPushNeverWaitsOnASilentClickHouse: an address that accepts
// connections and never answers costs the push its --replay-timeout, and
// the push is applied.
func TestPushNeverWaitsOnASilentClickHouse(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	env := []string{"KAFKA_BROKERS=" + k.Addr(), "CLICKHOUSE_ADDR=" + ln.Addr().String()}
	out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", pushInForce), "-m", "m", "--replay-timeout", "1s")
	if code != 0 || !strings.Contains(out, "applied: revision 1") || !strings.Contains(errOut, "replay skipped") {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	t.Logf("push beside a silent ClickHouse: %s", errOut)
	// Not configured: an invalid address is said, and the push goes on.
	out, errOut, code = runCLI(t, []string{"KAFKA_BROKERS=" + k.Addr(), "CLICKHOUSE_ADDR=nope"}, "policy", "push", writeTemp(t, "b.yaml", pushCandidate), "-m", "m")
	if code != 0 || !strings.Contains(out, "applied: revision 2") || !strings.Contains(errOut, "ClickHouse is not configured") {
		t.Fatalf("push with CLICKHOUSE_ADDR invalid: %d %q %q", code, out, errOut)
	}
}

// TestOverrideStoreRoutesTheKey: `override set KEY --store NAME` moves a
// key to dedicated capacity on every limiter of the log: its bucket is on
// that store's Redis and not the default's. A limiter without the store
// still applies the revision, decides the key degraded and names the
// store as missing in /readyz. Writers refuse a store their REDIS_STORES
// lacks, and the log refuses a store on a key-and-scope override.
func TestOverrideStoreRoutesTheKey(t *testing.T) {
	t.Parallel()
	def, acme := testenv.StartRedis(t), testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	cli := []string{"KAFKA_BROKERS=" + k.Addr(), "CLICKHOUSE_ADDR=127.0.0.1:1", "REDIS_STORES=acme=" + acme.Addr()}
	if out, errOut, code := runCLI(t, cli, "policy", "push", writeTemp(t, "a.yaml", pushInForce), "-m", "m", "--no-replay"); code != 0 {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	// A store deadline a loaded machine does not reach: these stores are up.
	withAcme := startLimiter(t, logBootstrap, append(storesEnv(def, acme), "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=",
		"LIMITER_STORE_TIMEOUT=2s")...)
	without := startLimiter(t, logBootstrap, "REDIS_ADDRS="+def.Addr(), "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=",
		"LIMITER_STORE_TIMEOUT=2s")

	out, errOut, code := runCLI(t, cli, "override", "set", "acct_big", "--store", "acme", "--reason", "dedicated capacity")
	if code != 0 || !strings.Contains(out, "applied: revision 2") {
		t.Fatalf("override set --store: %d %q %q", code, out, errOut)
	}
	if out, _, _ := runCLI(t, cli, "override", "get", "acct_big"); !strings.Contains(out, "store acme") {
		t.Fatalf("override get: %q", out)
	}
	waitRevision(t, withAcme, 2)
	waitRevision(t, without, 2)

	for _, key := range []string{"acct_big", "acct_small"} {
		for i := range 6 {
			d, status := withAcme.check(t, key, "api", 1)
			if status != 200 || d.Allowed != (i < 5) || (i < 5 && d.Source != "shared") || d.Policy != "free" {
				t.Fatalf("%s #%d: %d %+v, want burst 5 of free decided by the shared store", key, i, status, d)
			}
		}
	}
	if !bucketHeld(t, acme, "acct_big") || bucketHeld(t, def, "acct_big") {
		t.Errorf("acct_big: on acme %v, on default %v; want acme only", bucketHeld(t, acme, "acct_big"), bucketHeld(t, def, "acct_big"))
	}
	if bucketHeld(t, acme, "acct_small") || !bucketHeld(t, def, "acct_small") {
		t.Errorf("acct_small: on acme %v, on default %v; want default only", bucketHeld(t, acme, "acct_small"), bucketHeld(t, def, "acct_small"))
	}

	// The limiter without acme: degraded for acct_big only, and says why.
	if d, _ := without.check(t, "acct_big", "api", 1); d.Source != "degraded" {
		t.Errorf("acct_big on the limiter without acme: %+v, want degraded", d)
	}
	if d, _ := without.check(t, "acct_other", "api", 1); d.Source != "shared" {
		t.Errorf("acct_other on the limiter without acme: %+v, want shared", d)
	}
	ready := without.readyz(t)
	stores, _ := ready["stores"].(map[string]any)
	a, _ := stores["acme"].(map[string]any)
	d, _ := stores["default"].(map[string]any)
	if a["status"] != "missing" || d["status"] != "ok" || ready["status"] != "degraded" || !strings.Contains(fmt.Sprint(ready["reason"]), "acme") {
		t.Errorf("readyz of the limiter without acme: %v", ready)
	}
	if got := without.metric(t, "limiter_policy_missing_stores"); got != 1 {
		t.Errorf("limiter_policy_missing_stores = %v, want 1", got)
	}
	if got := withAcme.metric(t, "limiter_policy_missing_stores"); got != 0 {
		t.Errorf("limiter_policy_missing_stores with acme = %v, want 0", got)
	}

	// A writer whose REDIS_STORES lacks the name refuses before writing.
	other := []string{"KAFKA_BROKERS=" + k.Addr(), "REDIS_STORES=other=127.0.0.1:1"}
	if out, errOut, code := runCLI(t, other, "override", "set", "acct_x", "--store", "acme", "--reason", "r"); code != 1 || !strings.Contains(errOut, `store "acme", which REDIS_STORES does not name`) {
		t.Fatalf("override set with a store the writer lacks: %d %q %q", code, out, errOut)
	}
	routed := writeTemp(t, "r.yaml", pushInForce+"keys:\n  acct_y: { tier: pro, store: acme }\n")
	if out, errOut, code := runCLI(t, other, "policy", "push", routed, "-m", "m", "--no-replay"); code != 1 || !strings.Contains(errOut, "keys.acct_y.store") {
		t.Fatalf("push with a store the writer lacks: %d %q %q", code, out, errOut)
	}
	// Without REDIS_STORES it cannot tell: a warning, and the write.
	if out, errOut, code := runCLI(t, []string{"KAFKA_BROKERS=" + k.Addr(), "REDIS_STORES="}, "policy", "push", routed, "-m", "m", "--no-replay"); code != 0 || !strings.Contains(errOut, "not checked") {
		t.Fatalf("push without REDIS_STORES: %d %q %q", code, out, errOut)
	}
	// A store routes a whole key: the log refuses it on a key and scope.
	if out, errOut, code := runCLI(t, cli, "override", "set", "acct_z", "--scope", "api", "--store", "acme", "--reason", "r"); code != 1 || !strings.Contains(errOut, "routes the whole key") {
		t.Fatalf("override set --scope --store: %d %q %q", code, out, errOut)
	}
	// A limiter started on a log whose document names a store it lacks
	// starts, and decides that key degraded.
	late := startLimiter(t, logBootstrap, "REDIS_ADDRS="+def.Addr(), "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=",
		"LIMITER_STORE_TIMEOUT=2s")
	waitRevision(t, late, 3)
	if d, _ := late.check(t, "acct_y", "api", 1); d.Source != "degraded" {
		t.Errorf("acct_y on a limiter started without acme: %+v, want degraded", d)
	}
	if st, _ := late.readyz(t)["stores"].(map[string]any); fmt.Sprint(st["acme"]) == "<nil>" || st["acme"].(map[string]any)["status"] != "missing" {
		t.Errorf("readyz stores of a limiter started without acme: %v", st)
	}
}
