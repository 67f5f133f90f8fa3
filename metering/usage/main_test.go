package usage

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// One clickhouse-server for the package; each test gets a fresh database.
var sharedCH *testenv.ClickHouse

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(testenv.MainWithClickHouse(m, &sharedCH))
}

const (
	testAdmin  = "admin-token-for-tests"
	testSecret = "0123456789abcdef0123456789abcdef"
)

// env is one test's API over a fresh, migrated database.
type env struct {
	t      *testing.T
	conn   driver.Conn
	db     string
	store  *Store
	signer *Signer
	srv    *Server
	http   *httptest.Server
	now    time.Time
	policy string
}

func newEnv(t *testing.T, ch *testenv.ClickHouse, now time.Time) *env {
	t.Helper()
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, conn: conn, db: db, now: now}
	var err error
	if e.store, err = NewStore(conn, db); err != nil {
		t.Fatal(err)
	}
	if e.signer, err = NewSigner([]byte(testSecret)); err != nil {
		t.Fatal(err)
	}
	e.policy = t.TempDir() + "/policy.yaml"
	writeFile(t, e.policy, testPolicy)
	e.srv = e.newServer()
	e.http = httptest.NewServer(e.srv.Handler())
	t.Cleanup(e.http.Close)
	return e
}

func (e *env) newServer() *Server {
	e.t.Helper()
	srv, err := New(Config{Store: e.store, Signer: e.signer, AdminToken: testAdmin, PolicyPath: e.policy,
		// The deadline is for a hung query only: on a loaded machine a sound
		// one can take seconds, and a stopped ClickHouse refuses at once.
		Now: func() time.Time { return e.now }, QueryTimeout: 30 * time.Second})
	if err != nil {
		e.t.Fatal(err)
	}
	return srv
}

const testPolicy = `version: 1
default_tier: free
tiers:
  free:       { rate: 10, burst: 20 }
  pro:        { rate: 100, burst: 200, soft_limit_percent: 80 }
  enterprise: { rate: 5000, burst: 10000, soft_limit_percent: 80, quota: { limit: 1000, period: month } }
rules:
  - name: pro-search
    tier: pro
    scope: "api:search"
    rate: 50
    burst: 100
costs: { "api:search": 10 }
keys: { acct_a: enterprise, acct_b: pro, acct_dash: enterprise }
`

func writeFile(t testing.TB, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// decision is one seeded rate-limit decision.
type decision struct {
	ts      time.Time
	key     string
	scope   string
	tier    string
	cost    uint64
	allowed bool
	warning bool
}

type rollupKey struct {
	key, scope, tier string
	start            time.Time
}

// seed writes decisions into the three rollups the way the meter-consumer
// does: one row per (key, scope, tier, bucket), several rows for one bucket
// allowed (they are summed on read).
func seed(t testing.TB, conn driver.Conn, db string, ds []decision) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for table, trunc := range map[string]func(time.Time) time.Time{
		"usage_minute": func(t time.Time) time.Time { return t.UTC().Truncate(time.Minute) },
		"usage_hour":   func(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) },
		"usage_day":    func(t time.Time) time.Time { return t.UTC().Truncate(24 * time.Hour) },
	} {
		agg := map[rollupKey]*Counts{}
		var order []rollupKey
		for _, d := range ds {
			k := rollupKey{d.key, d.scope, d.tier, trunc(d.ts)}
			c := agg[k]
			if c == nil {
				c = &Counts{}
				agg[k] = c
				order = append(order, k)
			}
			c.Requests++
			if d.allowed {
				c.Allowed++
				c.Cost += d.cost
			} else {
				c.Rejected++
			}
			if d.warning {
				c.Warnings++
			}
		}
		const batchSize = 50000
		for i := 0; i < len(order); i += batchSize {
			b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+"."+table+" (key, scope, tier, start, requests, allowed, rejected, cost, warnings)")
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range order[i:min(i+batchSize, len(order))] {
				c := agg[k]
				if err := b.Append(k.key, k.scope, k.tier, k.start, c.Requests, c.Allowed, c.Rejected, c.Cost, c.Warnings); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Send(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// do sends a request with an optional bearer token and returns status and body.
func (e *env) do(method, path, token string, body string) (int, []byte) {
	e.t.Helper()
	return doHTTP(e.t, e.http.URL, method, path, token, body)
}

func doHTTP(t testing.TB, base, method, path, token, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func doHTTPHandler(t *testing.T, s *Server, method, path, token string) (int, []byte) {
	t.Helper()
	h := httptest.NewServer(s.Handler())
	defer h.Close()
	return doHTTP(t, h.URL, method, path, token, "")
}

// newBenchEnv is newEnv for benchmarks (one database, one server).
func newBenchEnv(b *testing.B, conn driver.Conn, now time.Time) *env {
	b.Helper()
	db := fmt.Sprintf("bench%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })
	e := &env{conn: conn, db: db, now: now}
	var err error
	if e.store, err = NewStore(conn, db); err != nil {
		b.Fatal(err)
	}
	if e.signer, err = NewSigner([]byte(testSecret)); err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Store: e.store, Signer: e.signer, AdminToken: testAdmin, Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	e.srv = srv
	e.http = httptest.NewServer(srv.Handler())
	b.Cleanup(e.http.Close)
	return e
}

func decodeJSON(resp *http.Response, v any) error {
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
