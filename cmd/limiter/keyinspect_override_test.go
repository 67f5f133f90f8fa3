package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestLimiterInspectNamesOverrideAuthor: an override signed by a named
// author with a reason, applied from the policy log on a real Kafka
// broker, is shown by the limiter's own GET /admin/keys/inspect with its
// author (the signing key's identity), reason and message, read from the
// limiter's overrides with no policy log at hand: once from the limiter's
// own policy (no fleet), once from another limiter's /admin/keys/local.
func TestLimiterInspectNamesOverrideAuthor(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	dir := t.TempDir()
	alice, aliceKey := signerFile(t, dir, "alice")
	ring := filepath.Join(dir, "keyring")
	if err := os.WriteFile(ring, []byte(alice.KeyringLine("alice")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"KAFKA_BROKERS=" + k.Addr(), "POLICY_TRUSTED_KEYS_FILE=" + ring}
	signed := append(env, "POLICY_SIGNING_KEY_FILE="+aliceKey)
	if out, errOut, code := runCLI(t, signed, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--no-replay"); code != 0 {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	const reason = "contract 77: the Q4 deal"
	if out, errOut, code := runCLI(t, signed, "override", "set", "acct_vip", "--tier", "pro", "--reason", reason, "--author", "billing"); code != 0 {
		t.Fatalf("override set: %d %q %q", code, out, errOut)
	}
	const token = "inspect-token"
	lim := append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=", "LIMITER_AUTH_TOKEN="+token)
	a := startLimiter(t, logBootstrap, lim...)
	waitRevision(t, a, 2)
	b := startLimiter(t, logBootstrap, append(lim, "LIMITER_FLEET_URLS="+a.url)...)
	waitRevision(t, b, 2)

	for _, p := range []*limiterProc{a, b} {
		rep := adminInspect(t, p, token, "acct_vip", "api")
		r := rep.Rule.Rule
		if r == nil || r.Tier != "pro" || r.Override == nil {
			t.Fatalf("%s: rule %+v (error %q), want the override's tier pro", p.url, r, rep.Rule.Error)
		}
		ov := r.Override
		if ov.Revision != 2 || ov.Author != "alice/billing" || ov.Reason != reason || ov.Message != reason || ov.RecordError != "" {
			t.Fatalf("%s (rule from %s): override %+v; want revision 2 by alice/billing, reason and message %q, no recordError", p.url, r.From, ov, reason)
		}
	}
}

// adminInspect is the limiter's GET /admin/keys/inspect of key and scope.
func adminInspect(t *testing.T, p *limiterProc, token, key, scope string) support.Report {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.url+"/admin/keys/inspect?"+url.Values{"key": {key}, "scope": {scope}}.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("inspect: %s %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var rep support.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatalf("inspect: %v: %s", err, body)
	}
	return rep
}
