package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// metric is the sum of the samples of name whose labels contain every
// one of labels, scraped from url's /metrics.
func metric(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	code, b := call(t, "GET", url+"/metrics", "", "")
	if code != 200 {
		t.Fatalf("%s/metrics: %d", url, code)
	}
	var sum float64
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for _, lb := range labels {
			ok = ok && strings.Contains(l, lb)
		}
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err == nil {
			sum += f
		}
	}
	return sum
}

// eventually polls cond every 100 ms until it holds, failing after within
// with what.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(within))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSecureKafkaEndToEnd: the broker speaks only TLS (with client
// certificates) and SASL. The limiter (SCRAM-SHA-256) and the
// meter-consumer (SCRAM-SHA-512) start with a WRONG password in their
// secret files: the consumer's /readyz is 503 naming the refused
// credential, the limiter's /readyz says metering is failing, the refusals
// are counted and logged at error level, and the limiter's events are
// dropped and counted, not lost in silence. Then the files are fixed: the
// consumer recovers by itself (it re-reads the file before each check),
// the limiter on SIGHUP, neither restarted; decisions then flow limiter →
// broker → meter-consumer → ClickHouse, every event the broker
// acknowledged stored exactly once.
func TestSecureKafkaEndToEnd(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	k := testenv.StartSecureKafka(t, "ratelimit.decisions", 2)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	const wrong = "kafka-WRONG-pw-93c1"
	limiterPW, meterPW := filepath.Join(dir, "limiter-kafka-pw"), filepath.Join(dir, "meter-kafka-pw")
	for _, f := range []string{limiterPW, meterPW} {
		if err := os.WriteFile(f, []byte(wrong+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy}
	meter := start(t, "meter-consumer", "METER_ADDR", "/healthz", append(append(common, k.Env("scram-sha-512", meterPW)...),
		"METER_BATCH_WAIT=50ms", "METER_KAFKA_CHECK_EVERY=300ms")...)
	// The limiter checks rarely: only SIGHUP makes it re-read the file in time.
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", append(append(common, k.Env("scram-sha-256", limiterPW)...),
		"LIMITER_KAFKA_CHECK_EVERY=1h")...)

	type readyBody struct {
		Reasons  map[string]string `json:"reasons"`
		Metering struct{ Status, Reason string }
	}
	readyz := func(p *proc) (int, readyBody) {
		code, b := call(t, "GET", p.url+"/readyz", "", "")
		var r readyBody
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s /readyz: %v: %s", p.name, err, b)
		}
		return code, r
	}
	var why string
	eventually(t, time.Minute, "meter-consumer /readyz never named the refused credential: "+why, func() bool {
		code, r := readyz(meter)
		why = r.Reasons["kafka"]
		return code == 503 && strings.Contains(why, "refused SASL") && strings.Contains(why, "KAFKA_SASL_PASSWORD")
	})
	eventually(t, time.Minute, "limiter /readyz never said metering is failing", func() bool {
		code, r := readyz(limiter)
		why = r.Metering.Reason
		return code == 200 && r.Metering.Status == "failing" && strings.Contains(why, "refused SASL")
	})
	for _, p := range []*proc{meter, limiter} {
		if n := metric(t, p.url, "kafka_connection_checks_total", `result="auth"`); n < 1 {
			t.Fatalf("%s: kafka_connection_checks_total{result=auth} = %v", p.name, n)
		}
		if !strings.Contains(p.logs.String(), `"level":"ERROR","msg":"kafka: connection check failed"`) {
			t.Fatalf("%s logged no error for the refused credential", p.name)
		}
	}
	check := func(key string) {
		code, b := call(t, "POST", limiter.url+"/check", "", fmt.Sprintf(`{"key":%q,"scope":"api:read"}`, key))
		if code != 200 {
			t.Fatalf("check: %d %s", code, b)
		}
	}
	for i := 0; i < 5; i++ {
		check("acct_before")
	}
	eventually(t, time.Minute, "the limiter never counted its events as dropped", func() bool {
		return metric(t, limiter.url, "metering_emitter_events_dropped_total", `reason="refused"`) == 5
	})

	// Fix the secrets: no restart.
	for _, f := range []string{limiterPW, meterPW} {
		if err := os.WriteFile(f, []byte(k.Password+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := limiter.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "limiter metering never recovered after SIGHUP", func() bool {
		_, r := readyz(limiter)
		return r.Metering.Status == "ok"
	})
	eventually(t, 2*time.Minute, "meter-consumer never became ready with the fixed password file", func() bool {
		code, _ := readyz(meter)
		return code == 200
	})
	// The writer's cached cluster metadata still holds the refusal for up
	// to its refresh interval (kafka-go's MetadataTTL): events meanwhile
	// are dropped and counted. Send until the broker acknowledges one.
	total := 5
	eventually(t, time.Minute, "the limiter's writer never recovered", func() bool {
		check("acct_probe")
		total++
		return metric(t, limiter.url, "metering_emitter_events_sent_total") > 0
	})
	const more = 40
	for i := 0; i < more; i++ {
		check(fmt.Sprintf("acct_%d", i%4))
	}
	total += more
	// Every decision is either acknowledged or dropped and counted.
	var sent float64
	eventually(t, time.Minute, "some events neither acknowledged nor counted as dropped", func() bool {
		sent = metric(t, limiter.url, "metering_emitter_events_sent_total")
		return sent+metric(t, limiter.url, "metering_emitter_events_dropped_total") == float64(total)
	})
	if sent < more {
		t.Fatalf("only %v of the %d events after recovery acknowledged", sent, more)
	}
	n := uint64(sent)
	conn := ch.Conn(t)
	var rows uint64
	eventually(t, 2*time.Minute, "decisions_raw never held the acknowledged events", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".decisions_raw").Scan(&rows); err != nil {
			t.Fatalf("count: %v", err)
		}
		if rows > n {
			t.Fatalf("decisions_raw holds %d rows, more than the %d events sent", rows, n)
		}
		return rows == n
	})
	if !strings.Contains(limiter.logs.String(), "kafka: SASL password changed") {
		t.Errorf("limiter did not log the re-read password")
	}
	for _, p := range []*proc{limiter, meter} {
		p.stop(t)
	}
}
