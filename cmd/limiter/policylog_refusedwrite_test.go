package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestWriterNeverToldAppliedForARecordTheFleetRefuses: a write exits 0
// with "applied" only for a record the fleet applies.
//
//   - A fleet trusts only signed records (POLICY_TRUSTED_KEYS_FILE) and the
//     document in force is signed; a CLI with neither key nor keyring sets
//     an override: refused (unauthenticated) before anything is written,
//     read from the log (the signed record in force), and the fleet
//     stays at revision 1.
//   - On a new log, a CLI with the fleet's keyring and no signing key
//     is refused (unauthenticated) without asking anyone: its own
//     environment says the readers trust only signed records.
//   - On a new log whose first record nobody signed yet, a CLI with
//     neither key nor keyring learns the fleet's trust from the fleet (LIMITER_FLEET_URLS):
//     refused (unauthenticated), nothing written.
//   - Signed by a key the fleet's keyring lacks, with LIMITER_FLEET_URLS:
//     written, refused by the fleet, and reported refused with the
//     fleet's reason (/readyz policy.refused).
//   - The broker loses the log while the fleet holds revision 2; a push
//     onto the empty log, with LIMITER_FLEET_URLS, is refused (lost_log)
//     naming the revision the fleet holds, and nothing is written.
func TestWriterNeverToldAppliedForARecordTheFleetRefuses(t *testing.T) {
	t.Parallel()
	testenv.SkipShort(t)
	port := testenv.FreePort(t)
	k, err := testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: "ratelimit.decisions", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	aliceKey := filepath.Join(t.TempDir(), "alice.pem")
	line, errOut, code := runCLI(t, nil, "policy", "keygen", "alice", "--out", aliceKey)
	if code != 0 {
		t.Fatalf("keygen: %d %q", code, errOut)
	}
	keys := writeTemp(t, "keyring", line)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	alice := append(env, "POLICY_TRUSTED_KEYS_FILE="+keys, "POLICY_SIGNING_KEY_FILE="+aliceKey)

	// A new log, and a fleet that trusts only alice's records.
	p := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "POLICY_TRUSTED_KEYS_FILE="+keys, "LIMITER_GRPC_ADDR=")...)
	out, errOut, code := runCLI(t, append(env, "POLICY_TRUSTED_KEYS_FILE="+keys), "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "unsigned, keyring", "--no-replay")
	if code != 1 || !strings.Contains(errOut, "refused (unauthenticated)") || !strings.Contains(errOut, "POLICY_TRUSTED_KEYS_FILE") || strings.Contains(out, "applied") {
		t.Fatalf("an unsigned first push with the fleet's keyring and no fleet to ask: exit %d, %q %q", code, out, errOut)
	}
	fleet := append(env, "LIMITER_FLEET_URLS="+p.url)
	out, errOut, code = runCLI(t, fleet, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "unsigned first", "--no-replay")
	if code != 1 || !strings.Contains(errOut, "refused (unauthenticated)") || !strings.Contains(errOut, p.url) || strings.Contains(out, "applied") {
		t.Fatalf("an unsigned first push onto a fleet that trusts only signed records: exit %d, %q %q", code, out, errOut)
	}
	// A limiter that is down (nothing listens) is not waited for: it
	// applies the log's rule when it is back.
	down := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	out, errOut, code = runCLI(t, append(alice, "LIMITER_FLEET_URLS="+down+","+p.url), "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--no-replay")
	if code != 0 || !strings.Contains(out, "applied: revision 1") {
		t.Fatalf("alice's push: %d %q %q", code, out, errOut)
	}
	if pol := p.policyOf(t); pol["revision"] != float64(1) || pol["signed"] != true {
		t.Fatalf("applied means the fleet applied it: %v", pol)
	}

	// No key, no keyring, no fleet to ask: the log says its writers sign.
	out, errOut, code = runCLI(t, env, "override", "set", "acct_1", "--tier", "pro", "--reason", "r")
	if code != 1 || !strings.Contains(errOut, "refused (unauthenticated)") || strings.Contains(out, "applied") {
		t.Fatalf("an unsigned override onto a signed log: exit %d, %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, alice, "override", "set", "acct_1", "--tier", "pro", "--reason", "r")
	if code != 0 || !strings.Contains(out, "applied: revision 2") {
		t.Fatalf("alice's override (the unsigned one wrote nothing): %d %q %q", code, out, errOut)
	}
	waitRevision(t, p, 2)

	// A key the fleet's keyring lacks: the record is written (the CLI,
	// with no keyring, cannot judge it), the fleet refuses it, and the
	// writer is told so, with the fleet's reason.
	bobKey := filepath.Join(t.TempDir(), "bob.pem")
	if _, errOut, code := runCLI(t, nil, "policy", "keygen", "bob", "--out", bobKey); code != 0 {
		t.Fatalf("keygen: %d %q", code, errOut)
	}
	bob := append(env, "POLICY_SIGNING_KEY_FILE="+bobKey, "LIMITER_FLEET_URLS="+p.url)
	out, errOut, code = runCLI(t, bob, "override", "set", "acct_2", "--tier", "pro", "--reason", "r")
	if code != 1 || !strings.Contains(errOut, "refused (unauthenticated)") || !strings.Contains(errOut, p.url+" refused it") || strings.Contains(out, "applied") {
		t.Fatalf("an override signed by a key the fleet does not trust: exit %d, %q %q", code, out, errOut)
	}

	// The broker loses the log; the fleet holds revision 2.
	k.Close()
	if k, err = testenv.NewKafkaWith(kafkadev.Config{Port: port, Topic: "ratelimit.decisions", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, append(alice, "LIMITER_FLEET_URLS="+p.url), "policy", "push", writeTemp(t, "b.yaml", logDocA), "-m", "onto the empty log", "--no-replay")
	if code != 1 || !strings.Contains(errOut, "refused (lost_log)") || !strings.Contains(errOut, "revision 2") || strings.Contains(out, "applied") {
		t.Fatalf("a push onto a lost log: exit %d, %q %q", code, out, errOut)
	}
	if pol := p.policyOf(t); pol["revision"] != float64(2) {
		t.Fatalf("the fleet after the refused push: %v", pol)
	}
}
