package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// quotaResetPolicy limits by its quota alone (the bucket is never the
// limit here); a month, so that no window ends within a run.
const quotaResetPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 100, burst: 100, quota: { limit: 3, period: month } }
`

// quotaResetLooser allows one request more in each window.
const quotaResetLooser = `
version: 1
default_tier: free
tiers:
  free: { rate: 100, burst: 100, quota: { limit: 4, period: month } }
`

// TestReplayAcrossAQuotaReset records a key that spends its quota, is
// rejected, has its quota reset by support (`limiter key reset --quota`),
// spends it again and is rejected again, through limiters on a real
// Redis, the broker and the real meter-consumer into ClickHouse; `limiter
// policy replay` resets its own quota counter at the reset's row, so
// under the policy in force it decides the requests after the reset as
// the store did, and under a looser candidate the reset frees that
// candidate's quota too.
func TestReplayAcrossAQuotaReset(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	k, ch, db := startRecording(t, 1)
	dir := t.TempDir()
	sam, samKey := signerFile(t, dir, "sam")
	ring := filepath.Join(dir, "keyring")
	if err := os.WriteFile(ring, []byte(sam.KeyringLine("sam")+" role=support\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each rejection on a limiter that has not decided the key before, so
	// that the store decides it (a local rejection is recorded at the
	// limiter's millisecond, which may order it before the decision that
	// taught it); the allowed ones and the reset on the first.
	env := []string{"REDIS_ADDRS=" + r.Addr(), "KAFKA_BROKERS=" + k.Addr(), "POLICY_TRUSTED_KEYS_FILE=" + ring, "LIMITER_GRPC_ADDR=", storeDecides()}
	var p [3]*limiterProc
	for i := range p {
		p[i] = startLimiter(t, quotaResetPolicy, env...)
	}
	from := time.Now().Add(-time.Minute).Truncate(time.Second)

	spend := func(rejecter *limiterProc) {
		t.Helper()
		for i, want := range []bool{true, true, true, false} {
			on := p[0]
			if !want {
				on = rejecter
			}
			d, status := on.check(t, "acct_q", "api", 1)
			if status != 200 || d.Allowed != want {
				t.Fatalf("request %d: status %d allowed %v, want %v", i+1, status, d.Allowed, want)
			}
		}
	}
	spend(p[1])
	if out, errOut, code := runCLI(t, []string{"LIMITER_FLEET_URLS=" + p[0].url, "POLICY_SIGNING_KEY_FILE=" + samKey},
		"key", "reset", "acct_q", "--scope", "api", "--quota", "--reason", "double-counted by the settle bug"); code != 0 {
		t.Fatalf("quota reset: exit %d: %s %s", code, out, errOut)
	}
	spend(p[2])
	waitRaw(t, ch, db, 9) // 8 decisions and the reset
	to := time.Now().Add(time.Minute).Truncate(time.Second)
	chEnv := []string{"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db}

	same := runReplayBin(t, quotaResetPolicy, chEnv, from, to)
	t.Logf("policy in force: %d rows, %d quota resets, total %+v, agreement %+v", same.Rows, same.QuotaResets, same.Total, same.Agreement)
	if same.Rows != 8 || same.QuotaResets != 1 || same.Total.RecordedRejected != 2 || same.Total.Rejected != 2 ||
		same.Total.NewlyRejected != 0 || same.Total.NewlyAllowed != 0 || same.Agreement.Compared != 8 || same.Agreement.DifferBeyondTolerance != 0 {
		t.Fatalf("the policy in force does not reproduce the requests around the reset: rows %d, resets %d, %+v, %+v (%s)",
			same.Rows, same.QuotaResets, same.Total, same.Agreement, same.FirstDifference)
	}
	looser := runReplayBin(t, quotaResetLooser, chEnv, from, to)
	if looser.QuotaResets != 1 || looser.Total.Rejected != 0 || looser.Total.NewlyAllowed != 2 {
		t.Fatalf("a quota of 4: total %+v, resets %d; want both rejections newly allowed (4 before the reset, 4 after)", looser.Total, looser.QuotaResets)
	}
}
