package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const supportPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 0.001, burst: 5, quota: { limit: 1000, period: day } }
`

// signerFile writes a new signing key for a test and returns it with its
// file.
func signerFile(t *testing.T, dir, name string) (*policylog.Signer, string) {
	t.Helper()
	s, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(path, s.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return s, path
}

// TestKeyInspectAndReset is the support tools end to end on two real
// limiters sharing a real Redis: inspect shows the exhausted key's bucket,
// rule and each limiter's local view; resets without a reason, by a read
// identity and by a key nobody trusts are refused (the last two audited);
// a support identity's refill is applied, audited with its author, and
// every limiter answers from the new state; with one limiter killed,
// inspect still answers and marks it.
func TestKeyInspectAndReset(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	dir := t.TempDir()
	_, samKey := signerFile(t, dir, "sam")
	_, ritaKey := signerFile(t, dir, "rita")
	_, malloryKey := signerFile(t, dir, "mallory")
	sam, _ := policylog.LoadSigner(samKey)
	rita, _ := policylog.LoadSigner(ritaKey)
	ring := sam.KeyringLine("sam") + " role=support\n" + rita.KeyringLine("rita") + " role=read\n"
	ringPath := filepath.Join(dir, "keyring")
	if err := os.WriteFile(ringPath, []byte(ring), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"REDIS_ADDRS=" + r.Addr(), "POLICY_TRUSTED_KEYS_FILE=" + ringPath}
	a := startLimiter(t, supportPolicy, env...)
	b := startLimiter(t, supportPolicy, env...)
	fleet := "LIMITER_FLEET_URLS=" + a.url + "," + b.url

	for _, p := range []*limiterProc{a, b} {
		for i := 0; ; i++ {
			d, status := p.check(t, "acct_8812", "api", 1)
			if status != 200 {
				t.Fatalf("check: %d", status)
			}
			if !d.Allowed {
				break
			}
			if i > 10 {
				t.Fatal("never rejected")
			}
		}
	}

	inspect := func() support.Report {
		t.Helper()
		out, errOut, code := runCLI(t, []string{fleet, "REDIS_ADDRS=" + r.Addr()}, "key", "inspect", "acct_8812", "--scope", "api", "--json", "--timeout", "3s")
		if code != 0 {
			t.Fatalf("inspect exit %d: %s", code, errOut)
		}
		var rep support.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("inspect --json: %v\n%s", err, out)
		}
		return rep
	}
	rep := inspect()
	if rep.Key != "acct_8812" || rep.Scope != "api" || rep.Rule.Rule == nil || rep.Rule.Policy != "free" {
		t.Fatalf("inspect: key %q scope %q rule %+v", rep.Key, rep.Scope, rep.Rule)
	}
	if rep.Bucket.BucketView == nil || rep.Bucket.Tokens >= 1 || rep.Bucket.Capacity != 5 || rep.Bucket.Rate != 0.001 {
		t.Fatalf("inspect bucket: %+v (error %q), want an exhausted bucket of 5 at 0.001/s", rep.Bucket.BucketView, rep.Bucket.Error)
	}
	if rep.Quota == nil || rep.Quota.QuotaView == nil || rep.Quota.Used != 5 {
		t.Fatalf("inspect quota: %+v, want 5 used", rep.Quota)
	}
	if len(rep.Limiters) != 2 {
		t.Fatalf("inspect limiters: %d entries, want 2", len(rep.Limiters))
	}
	for _, l := range rep.Limiters {
		if l.Error != "" || l.LocalAnswer == nil || !l.View.Held || !l.View.StoreKnown || l.View.StoreTokens >= 1 {
			t.Fatalf("limiter %s: %+v (error %q); want a held entry that knows the bucket empty", l.URL, l.LocalAnswer, l.Error)
		}
	}
	if rep.Decisions.Error == "" {
		t.Fatal("decisions without CLICKHOUSE_ADDR: want the part marked not configured")
	}

	reset := func(keyFile string, extra ...string) (string, string, int) {
		args := append([]string{"key", "reset", "acct_8812", "--scope", "api"}, extra...)
		return runCLI(t, []string{fleet, "POLICY_SIGNING_KEY_FILE=" + keyFile}, args...)
	}
	if _, errOut, code := reset(samKey, "--refill"); code != 2 || !strings.Contains(errOut, "--reason") {
		t.Fatalf("reset without a reason: exit %d, %q; want 2 naming --reason", code, errOut)
	}
	if _, errOut, code := reset(ritaKey, "--refill", "--reason", "looks wrong"); code != 1 || !strings.Contains(errOut, "forbidden") {
		t.Fatalf("reset by a read identity: exit %d, %q; want 1, forbidden", code, errOut)
	}
	if _, errOut, code := reset(malloryKey, "--refill", "--reason", "trust me"); code != 1 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("reset by an untrusted key: exit %d, %q; want 1, unauthenticated", code, errOut)
	}
	began := time.Now()
	if out, errOut, code := reset(samKey, "--refill", "--reason", "our mistake: ticket 4411"); code != 0 {
		t.Fatalf("reset by support: exit %d: %s %s", code, out, errOut)
	}
	for _, p := range []*limiterProc{a, b} {
		eventually(t, "a limiter allows the key after the reset", func() bool {
			d, _ := p.check(t, "acct_8812", "api", 1)
			return d.Allowed
		})
	}
	t.Logf("every limiter allowed the key %v after the reset was sent", time.Since(began))

	rep = inspect()
	if len(rep.Resets) != 3 {
		t.Fatalf("resets: %d records, want 3 (the refill, and the two refusals that reached a limiter)", len(rep.Resets))
	}
	var newest struct {
		support.Audit
		Before, After struct{ Tokens float64 }
	}
	if err := json.Unmarshal(rep.Resets[0], &newest); err != nil {
		t.Fatal(err)
	}
	if newest.Author != "sam" || newest.Result != "applied" || newest.Reason != "our mistake: ticket 4411" || newest.Time.IsZero() ||
		newest.Before.Tokens >= 1 || newest.After.Tokens != 5 {
		t.Fatalf("newest reset record: %s", rep.Resets[0])
	}
	var older support.Audit
	_ = json.Unmarshal(rep.Resets[1], &older)
	if older.Result != "refused" || older.Code != support.CodeUnauthenticated {
		t.Fatalf("second reset record: %s; want mallory's refusal", rep.Resets[1])
	}

	// One limiter gone: inspect still answers, and says which.
	b.cmd.Process.Signal(syscall.SIGKILL)
	<-b.done
	rep = inspect()
	if rep.Limiters[1].Error == "" || rep.Limiters[0].Error != "" || rep.Bucket.Error != "" {
		t.Fatalf("with %s killed: limiters %+v, bucket error %q", b.url, rep.Limiters, rep.Bucket.Error)
	}
}

// TestQuotaResetIsAUsageEvent: a quota reset sets the key's count back to
// zero and is an event of kind reset on the decisions topic, carrying the
// reset's id, beside the decisions it follows.
func TestQuotaResetIsAUsageEvent(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	const topic = "ratelimit.decisions"
	k := testenv.StartKafka(t, topic, 1)
	dir := t.TempDir()
	sam, samKey := signerFile(t, dir, "sam")
	ringPath := filepath.Join(dir, "keyring")
	if err := os.WriteFile(ringPath, []byte(sam.KeyringLine("sam")+" role=support\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startLimiter(t, supportPolicy, "REDIS_ADDRS="+r.Addr(), "KAFKA_BROKERS="+k.Addr(), "POLICY_TRUSTED_KEYS_FILE="+ringPath)
	for range 3 {
		if _, status := p.check(t, "acct_q", "api", 1); status != 200 {
			t.Fatal("check failed")
		}
	}
	out, errOut, code := runCLI(t, []string{"LIMITER_FLEET_URLS=" + p.url, "POLICY_SIGNING_KEY_FILE=" + samKey},
		"key", "reset", "acct_q", "--scope", "api", "--quota", "--reason", "double-counted by the settle bug", "--json")
	if code != 0 {
		t.Fatalf("quota reset: exit %d: %s %s", code, out, errOut)
	}
	var ans struct {
		Record struct {
			support.Audit
			Before, After struct{ QuotaUsed int64 }
		}
	}
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if ans.Record.Before.QuotaUsed != 3 || ans.Record.After.QuotaUsed != 0 || ans.Record.ID == "" {
		t.Fatalf("record %+v, want quota used 3 → 0", ans.Record)
	}
	eventually(t, "the reset's event on the topic", func() bool {
		for _, ev := range topicEvents(t, k.Addr(), topic) {
			if ev.Key == "acct_q" && ev.Kind == "reset" {
				if ev.Reservation != ans.Record.ID || ev.Cost != 0 || ev.Limit != 1000 {
					t.Fatalf("reset event %+v, want id %s, no cost, quota limit 1000", ev, ans.Record.ID)
				}
				return true
			}
		}
		return false
	})
	if d, _ := p.check(t, "acct_q", "api", 1); !d.Allowed {
		t.Fatal("check after the quota reset rejected")
	}
}
