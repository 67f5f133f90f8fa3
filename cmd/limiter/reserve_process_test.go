package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/testkit/testenv"
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
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_RESERVATION_TTL=1s", storeDecides()}
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
	if got := a.metric(t, "limiter_settles_queued"); got != 0 {
		t.Fatalf("limiter_settles_queued = %v, want 0", got)
	}
}

// TestReserveSettleExactAcrossFourProcesses is the exactness target over
// HTTP: four limiter processes on one redis-server take a random mix of
// reserve, settle (some twice, some after LIMITER_RESERVATION_TTL, and
// each on a random instance), charge and cost-0 checks on one key at
// once; at the end the bucket Redis holds is burst + refill − Σ actual
// costs, where a reservation not settled in time costs its estimate and
// the refill is the rate over the bucket's own first and last instants.
func TestReserveSettleExactAcrossFourProcesses(t *testing.T) {
	r := testenv.StartRedis(t)
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_RESERVATION_TTL=1s", storeDecides()}
	var procs []*limiterProc
	for range 4 {
		procs = append(procs, startLimiter(t, reservePolicy, env...))
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	bucketKey := keyslot.BucketKey(limits.DefaultKeyPrefix, "acct", "tokens")
	if code, s := procs[0].post(t, "/charge", `{"key":"acct","scope":"tokens","cost":200}`); code != 200 || s["remaining"] != 800.0 {
		t.Fatalf("first charge: %d %v", code, s)
	}
	first, found, err := redisstore.ReadBucket(ctx, rdb, bucketKey)
	if err != nil || !found {
		t.Fatalf("bucket after the first charge: %v %v", found, err)
	}
	spent := make([]int64, 4)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 36))
			var ids []string
			var ests []int64
			settle := func(i int, actual int64) {
				p := procs[rng.IntN(4)]
				code, s := p.post(t, "/settle", fmt.Sprintf(`{"reservation":%q,"cost":%d}`, ids[i], actual))
				switch code {
				case 200:
					spent[w] += actual - ests[i]
					ests[i] = actual // settled: a second settle must not charge
				case 404, 409:
				default:
					t.Errorf("settle: %d %v", code, s)
				}
			}
			for range 120 {
				p := procs[rng.IntN(4)]
				switch op := rng.IntN(10); {
				case op < 4:
					est := 1 + rng.Int64N(30)
					code, d := p.post(t, "/check", fmt.Sprintf(`{"key":"acct","scope":"tokens","cost":%d,"reserve":true}`, est))
					if code != 200 {
						t.Errorf("reserve: %d %v", code, d)
						return
					}
					if id, _ := d["reservation"].(string); id != "" {
						spent[w] += est
						ids, ests = append(ids, id), append(ests, est)
					}
				case op < 7 && len(ids) > 0:
					settle(rng.IntN(len(ids)), rng.Int64N(60))
				case op < 8:
					c := rng.Int64N(20)
					if code, s := p.post(t, "/charge", fmt.Sprintf(`{"key":"acct","scope":"tokens","cost":%d}`, c)); code != 200 {
						t.Errorf("charge: %d %v", code, s)
						return
					}
					spent[w] += c
				default:
					p.post(t, "/check", `{"key":"acct","scope":"tokens","cost":0}`)
				}
			}
			time.Sleep(1100 * time.Millisecond) // the rest outlive their TTL
			for i := range ids {
				if rng.IntN(2) == 0 {
					settle(i, rng.Int64N(60))
				}
			}
		}()
	}
	wg.Wait()
	b, found, err := redisstore.ReadBucket(ctx, rdb, bucketKey)
	if err != nil || !found {
		t.Fatalf("bucket: %v %v", found, err)
	}
	var total int64 = 200
	for _, s := range spent {
		total += s
	}
	refill := (1.0 / 3600) * float64(b.TS-first.TS) / 1e6
	want := first.Tokens + 200 + refill - float64(total)
	if math.Abs(b.Tokens-want) > 1e-6 {
		t.Fatalf("bucket %.9f tokens, want 1000 + %.9f − %d = %.9f", b.Tokens, refill, total, want)
	}
	t.Logf("spent %d, bucket %.3f", total, b.Tokens)
}
