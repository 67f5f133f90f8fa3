package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/limits"
)

const reservePolicy = `
version: 1
default_tier: llm
tiers:
  llm: { rate: 1, period: hour, burst: 1000 }
`

// post sends body to path and returns the status and the decoded answer.
func (p *limiterProc) post(t *testing.T, path, body string) (int, map[string]any) {
	t.Helper()
	resp, err := client.Post(p.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("POST %s: %q: %v", path, b, err)
	}
	return resp.StatusCode, out
}

// TestReserveOnOneInstanceSettleOnAnother: two limiter processes on one
// redis-server; a reservation made through one is settled through the
// other, a second settle is refused, a charge takes the bucket into debt
// and both then reject, and a reservation past LIMITER_RESERVATION_TTL is
// not found, its estimate spent.
func TestReserveOnOneInstanceSettleOnAnother(t *testing.T) {
	r := testenv.StartRedis(t)
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_RESERVATION_TTL=1s"}
	a := startLimiter(t, reservePolicy, env...)
	b := startLimiter(t, reservePolicy, env...)

	code, d := a.post(t, "/check", `{"key":"acct","scope":"tokens","cost":300,"reserve":true}`)
	id, _ := d["reservation"].(string)
	if code != 200 || d["allowed"] != true || id == "" {
		t.Fatalf("reserve: %d %v", code, d)
	}
	if code, s := b.post(t, "/settle", `{"reservation":"`+id+`","cost":742}`); code != 200 || s["remaining"] != 258.0 || s["settled"] != true {
		t.Fatalf("settle on the other instance: %d %v", code, s)
	}
	if code, s := a.post(t, "/settle", `{"reservation":"`+id+`","cost":742}`); code != 409 {
		t.Fatalf("second settle: %d %v", code, s)
	}
	if code, s := b.post(t, "/charge", `{"key":"acct","scope":"tokens","cost":500}`); code != 200 || s["debt"] != 242.0 {
		t.Fatalf("charge into debt: %d %v", code, s)
	}
	for _, p := range []*limiterProc{a, b} {
		if code, d := p.post(t, "/check", `{"key":"acct","scope":"tokens","cost":0}`); code != 200 || d["allowed"] != false {
			t.Fatalf("cost 0 in debt: %d %v", code, d)
		}
	}

	code, d = a.post(t, "/check", `{"key":"acct2","scope":"tokens","cost":100,"reserve":true}`)
	id, _ = d["reservation"].(string)
	if code != 200 || id == "" {
		t.Fatalf("reserve: %d %v", code, d)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	for { // Redis ends the record on its own clock, however long that takes here
		n, err := rdb.Exists(context.Background(), keyslot.ReservationKey(limits.DefaultKeyPrefix, "acct2", id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, s := b.post(t, "/settle", `{"reservation":"`+id+`","cost":1}`); code != 404 {
		t.Fatalf("expired: %d %v", code, s)
	}
	if code, s := b.post(t, "/charge", `{"key":"acct2","scope":"tokens","cost":0}`); code != 200 || s["remaining"] != 900.0 {
		t.Fatalf("after expiry the estimate stands: %d %v", code, s)
	}
}
