package deploytest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/testkit/repo"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// stack is the three services, built as the images build them, running
// against real redis-server, clickhouse-server and a Kafka-protocol broker.
type stack struct {
	limiter, meter, usage string // base URLs
	admin                 string // USAGE_ADMIN_TOKEN
	db                    string
	ch                    *testenv.ClickHouse
}

// startStack starts the services and sends them traffic that makes most
// labelled metrics appear: allowed and rejected decisions, dry-run
// would-be rejections, anonymous keys, soft-limit warnings, webhook
// attempts (to a receiver that fails), and usage read back through the API.
func startStack(t *testing.T) *stack {
	t.Helper()
	bin := buildBinaries(t)
	root := repo.Root(t)
	redis := testenv.StartRedis(t)
	ch := testenv.StartClickHouse(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 4)
	db := ch.Database(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "receiver down", http.StatusInternalServerError)
	}))
	t.Cleanup(hook.Close)

	s := &stack{admin: "admin-token-for-deploytest", db: db, ch: ch}
	la, ma, ua := freeAddr(t), freeAddr(t), freeAddr(t)
	s.limiter, s.meter, s.usage = "http://"+la, "http://"+ma, "http://"+ua
	policyFile := filepath.Join(root, "deploy", "policy.yaml")
	// usage-api's signing key, trusted by the limiter: the support page's
	// resets are signed by it and applied by the limiter.
	signer, err := policylog.GenerateSigner()
	if err != nil {
		t.Fatal(err)
	}
	keyDir := t.TempDir()
	signingKey, keyring := filepath.Join(keyDir, "usage-api.pem"), filepath.Join(keyDir, "keyring")
	if err := os.WriteFile(signingKey, signer.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyring, []byte(signer.KeyringLine("usage-api")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lim := startBinary(t, bin, "limiter", "LIMITER_ADDR="+la, "REDIS_ADDRS="+redis.Addr(),
		"KAFKA_BROKERS="+kafka.Addr(), "POLICY_FILE="+policyFile, "LIMITER_SPOOL_DIR="+filepath.Join(t.TempDir(), "spool"),
		"POLICY_TRUSTED_KEYS_FILE="+keyring)
	meter := startBinary(t, bin, "meter-consumer", "METER_ADDR="+ma, "KAFKA_BROKERS="+kafka.Addr(),
		"CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+db,
		"REDIS_ADDRS="+redis.Addr(), "POLICY_FILE="+policyFile, // the quota reconciler, as shipped
		"WEBHOOK_URL="+hook.URL, "WEBHOOK_SECRET=whsec_ZGVwbG95dGVzdC1zZWNyZXQtMTIzNDU2Nzg5MA==")
	// The billing accounts the OpenAPI document's example names.
	accounts := filepath.Join(t.TempDir(), "accounts")
	if err := os.WriteFile(accounts, []byte("acct_demo_pro cust_demo\nacct_8812 cust_demo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	usage := startBinary(t, bin, "usage-api", "USAGE_API_ADDR="+ua, "CLICKHOUSE_ADDR="+ch.Addr(), "BILLING_ACCOUNTS_FILE="+accounts,
		"CLICKHOUSE_DATABASE="+db, "POLICY_FILE="+policyFile, "REDIS_ADDRS="+redis.Addr(),
		"USAGE_ADMIN_TOKEN="+s.admin, "USAGE_TOKEN_SECRET=token-secret-for-deploytest",
		// KAFKA_BROKERS: the operator's policy API (the policy log); the
		// limiter and usage-api's key: the support page.
		"KAFKA_BROKERS="+kafka.Addr(),
		"LIMITER_FLEET_URLS="+s.limiter, "POLICY_SIGNING_KEY_FILE="+signingKey, "POLICY_TRUSTED_KEYS_FILE="+keyring)
	waitStatus(t, lim, s.limiter+"/readyz", 200, 30*time.Second)
	waitStatus(t, meter, s.meter+"/readyz", 200, 60*time.Second)
	waitStatus(t, usage, s.usage+"/readyz", 200, 60*time.Second)

	type call struct {
		key, scope string
		n          int
	}
	calls := []call{
		{"deploytest_free", "api:orders", 30}, // free tier: burst 20, soft limit 80%: warnings, rejections
		{"acct_demo_pro", "api:search", 15},   // pro-search is dry run: would_reject after 10
		{"ip:198.51.100.7", "api:orders", 8},  // anonymous: burst 5
		{"acct_8812", "api:export-csv", 12},   // exports rule: burst 10
		{"acct_8812", "health", 2},            // cost 0
	}
	total := 0
	for _, c := range calls {
		for i := 0; i < c.n; i++ {
			body := fmt.Sprintf(`{"key":%q,"scope":%q}`, c.key, c.scope)
			st, _, out := do(t, "POST", s.limiter+"/check", "", []byte(body))
			if st != 200 {
				t.Fatalf("POST /check %s: %d %s", body, st, out)
			}
			total++
		}
	}
	// The decisions reach ClickHouse through Kafka and the meter.
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		q := url.Values{"key": {"deploytest_free"}, "window": {"minute"}}
		st, _, out := do(t, "GET", s.usage+"/v1/usage?"+q.Encode(), s.admin, nil)
		var u struct {
			Totals struct{ Requests int } `json:"totals"`
		}
		if st == 200 && json.Unmarshal(out, &u) == nil && u.Totals.Requests == 30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage API never reported the 30 decisions of deploytest_free: %d %s", st, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = total
	return s
}

// TestRunningBinaries starts the real binaries once and checks the alert
// rules, the dashboard and the API descriptions against them.
func TestRunningBinaries(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	t.Run("rules and dashboard name exported metrics", func(t *testing.T) { checkMetrics(t, s) })
	t.Run("openapi", func(t *testing.T) { checkOpenAPI(t, s) })
}

// scrapeNames returns every sample name on a /metrics page (histograms and
// summaries with their _bucket, _sum and _count series).
func scrapeNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	st, _, out := do(t, "GET", url, "", nil)
	if st != 200 {
		t.Fatalf("GET %s: %d", url, st)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			switch f[3] {
			case "histogram":
				names[f[2]+"_bucket"], names[f[2]+"_sum"], names[f[2]+"_count"] = true, true, true
			case "summary":
				names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
			}
		}
	}
	return names
}
