package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// forge writes records straight onto the policy topic with a plain Kafka
// client, as anyone who can write the topic could.
func forge(t *testing.T, addr string, recs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: kafkalog.DefaultTopic, RequiredAcks: kafka.RequireAll, WriteTimeout: 30 * time.Second}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, recs...); err != nil {
		t.Fatal(err)
	}
}

// plausible is a forged override record that follows the head: the next
// revision, the content's SHA-256, a known author.
func plausible(t *testing.T, rev int64, key string, sign *policylog.Signer) kafka.Message {
	t.Helper()
	r := policylog.Record{Revision: rev, Parent: rev - 1, Kind: policylog.KindOverride, Author: "alice", Message: "upgrade",
		Time: time.Now().UTC(), Key: key, Override: &policy.Override{Tier: "pro", Reason: "upgrade"}}
	r.Seal()
	v, err := r.Encode()
	if sign != nil {
		v, err = sign.Encode(&r)
	}
	if err != nil {
		t.Fatal(err)
	}
	return kafka.Message{Key: []byte(r.LogKey()), Value: v}
}

// TestPolicyLogSignedWriters: with a keyring, records forged with a plain
// Kafka client (unsigned, or signed by a key the keyring lacks, each
// with a plausible revision, hash and author) are refused by every
// limiter as unauthenticated and counted; what the CLI writes with a key
// from `limiter policy keygen` (or one openssl made) is applied, authored
// by the key's identity.
func TestPolicyLogSignedWriters(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	dir := t.TempDir()
	aliceKey := filepath.Join(dir, "alice.pem")
	line, errOut, code := runCLI(t, nil, "policy", "keygen", "alice", "--out", aliceKey)
	if code != 0 || !strings.HasPrefix(line, "alice ") {
		t.Fatalf("keygen: %d %q %q", code, line, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "policy", "keygen", "alice", "--out", aliceKey); code != 1 || !strings.Contains(errOut, "not overwritten") {
		t.Fatalf("keygen over an existing key: %d %q", code, errOut)
	}
	if st, err := os.Stat(aliceKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v %v", st.Mode(), err)
	}
	keyring := line
	bobKey := filepath.Join(dir, "bob.pem")
	if _, err := exec.LookPath("openssl"); err == nil {
		if out, err := exec.Command("openssl", "genpkey", "-algorithm", "ed25519", "-out", bobKey).CombinedOutput(); err != nil {
			t.Fatalf("openssl: %v %s", err, out)
		}
		s, err := policylog.LoadSigner(bobKey)
		if err != nil {
			t.Fatalf("a key openssl wrote: %v", err)
		}
		keyring += s.KeyringLine("bob") + "\n"
	} else {
		t.Log("no openssl here: the openssl-made key is not tried")
		bobKey = ""
	}
	keys := writeTemp(t, "keyring", "# the policy log's writers\n"+keyring)
	env := []string{"KAFKA_BROKERS=" + k.Addr(), "POLICY_TRUSTED_KEYS_FILE=" + keys}
	alice := append(env, "POLICY_SIGNING_KEY_FILE="+aliceKey)

	out, errOut, code := runCLI(t, alice, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--author", "root", "--no-replay")
	if code != 0 || !strings.Contains(out, "applied: revision 1") {
		t.Fatalf("signed push: %d %q %q", code, out, errOut)
	}
	// A CLI with the keyring but no key writes nothing the readers
	// would refuse.
	_, errOut, code = runCLI(t, env, "override", "set", "acct_nokey", "--tier", "pro", "--reason", "r")
	if code != 1 || !strings.Contains(errOut, "refused (unauthenticated)") {
		t.Fatalf("unsigned CLI write: %d %q", code, errOut)
	}
	cache := t.TempDir()
	var fleet []*limiterProc
	for i := range 2 {
		e := append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")
		if i == 0 {
			e = append(e, "POLICY_CACHE_DIR="+cache)
		}
		fleet = append(fleet, startLimiter(t, logBootstrap, e...))
	}
	for _, p := range fleet {
		if pol := waitRevision(t, p, 1); pol["author"] != "alice/root" {
			t.Errorf("%s: the document's author %v, want alice/root", p.url, pol["author"])
		}
	}

	eve, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	forge(t, k.Addr(), plausible(t, 2, "acct_forged", nil), plausible(t, 2, "acct_eve", eve))

	writer := alice
	if bobKey != "" {
		writer = append(env, "POLICY_SIGNING_KEY_FILE="+bobKey)
	}
	out, errOut, code = runCLI(t, writer, "override", "set", "acct_real", "--tier", "pro", "--reason", "real", "--json")
	if code != 0 || !strings.Contains(out, `"revision":2`) {
		t.Fatalf("signed override after the forged ones: %d %q %q", code, out, errOut)
	}
	for _, p := range fleet {
		waitRevision(t, p, 2)
		if n := p.metric(t, `limiter_policy_log_records_total{code="unauthenticated",result="refused"}`); n != 2 {
			t.Errorf("%s: %v unauthenticated records counted, want 2", p.url, n)
		}
		for _, key := range []string{"acct_forged", "acct_eve"} {
			if d, _ := p.check(t, key, "x", 1); strings.HasPrefix(d.Policy, "override:") {
				t.Errorf("%s: %s decided by %q: a forged override applied", p.url, key, d.Policy)
			}
		}
		if d, _ := p.check(t, "acct_real", "x", 1); d.Policy != "override:acct_real" {
			t.Errorf("%s: acct_real decided by %q", p.url, d.Policy)
		}
	}
	out, _, code = runCLI(t, env, "policy", "history", "--json")
	var hist struct{ Entries []policylog.HistoryEntry }
	if err := json.Unmarshal([]byte(out), &hist); code != 0 || err != nil {
		t.Fatalf("history: %d %v %q", code, err, out)
	}
	var unauth, authors []string
	for _, h := range hist.Entries {
		if h.Code == policylog.CodeUnauthenticated {
			unauth = append(unauth, h.Subject+" by "+h.Author+": "+h.Reason)
		} else if h.Result == policylog.Applied {
			authors = append(authors, h.Author)
		}
	}
	wantWriter := "alice"
	if bobKey != "" {
		wantWriter = "bob"
	}
	if len(unauth) != 2 || strings.Join(authors, ",") != "alice/root,"+wantWriter {
		t.Fatalf("history: unauthenticated %q, applied by %q (want the two forged refused; applied by alice/root, %s)", unauth, authors, wantWriter)
	}
	for _, u := range unauth {
		if !strings.Contains(u, `names itself "alice"`) || strings.Contains(u, "by alice") {
			t.Errorf("a forged record is reported as %q: its claimed author must not be recorded as its author", u)
		}
	}

	// A limiter started again from its cache, which remembers the
	// signatures it checked, judges the log the same way.
	if st, err := os.Stat(filepath.Join(cache, policylog.CheckedFile)); err != nil || st.Size() == 0 {
		t.Fatalf("no checked signatures in the cache: %v", err)
	}
	again := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=", "POLICY_CACHE_DIR="+cache)...)
	waitRevision(t, again, 2)
	if n := again.metric(t, `limiter_policy_log_records_total{code="unauthenticated",result="refused"}`); n != 2 {
		t.Errorf("restarted from the cache: %v unauthenticated records, want 2", n)
	}
	if d, _ := again.check(t, "acct_forged", "x", 1); strings.HasPrefix(d.Policy, "override:") {
		t.Errorf("restarted from the cache: acct_forged decided by %q", d.Policy)
	}
}
