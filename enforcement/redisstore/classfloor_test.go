package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// classLimit is a bucket of 20 that refills so slowly (one token in 1,000
// s) that no test run sees a refill: what is left is what was spent.
func classLimit(share float64) enforcement.Limit {
	return enforcement.Limit{Rate: 0.001, Burst: 20, Share: share}
}

// aboutOneToken: a retry time of one token of classLimit (1,000 s), less
// what refilled while the test ran (up to a second: a thousandth of a
// token, far below one whole token).
func aboutOneToken(d time.Duration) bool { return d > 999*time.Second && d <= 1000*time.Second }

// TestClassFloorEveryScript: each script that spends a bucket (the
// decision, the batch, the reservation) keeps a class's floor. A class of
// share 0.5 spends the bucket of 20 down to 10 and is then shed (tokens
// left, reason shed) with a retry time until floor + cost is there; a peek
// for the class answers the same without spending; a class of share 1
// spends on down to 0, and is then refused for the rate, not shed.
func TestClassFloorEveryScript(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pipe := redisstore.NewPipelined(rdb, "floorpipe", redisstore.PipelineConfig{})
	done := make(chan error, 1)
	go func() { done <- pipe.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Each script its own prefix, so its own bucket of the key.
	st := redisstore.New(rdb, "floor")
	resv := redisstore.New(rdb, "floorresv")

	type taker func(key string, lim enforcement.Limit) (enforcement.Verdict, error)
	n := 0
	for _, c := range []struct {
		name string
		take taker
	}{
		{"bucket.lua", func(key string, lim enforcement.Limit) (enforcement.Verdict, error) {
			return st.Take(ctx, key, "api", lim, 1)
		}},
		{"batch.lua", func(key string, lim enforcement.Limit) (enforcement.Verdict, error) {
			return pipe.Take(ctx, key, "api", lim, 1)
		}},
		{"reserve.lua", func(key string, lim enforcement.Limit) (enforcement.Verdict, error) {
			n++
			return resv.Reserve(ctx, key, "api", lim, 1, fmt.Sprintf("resv-%d", n), time.Minute)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sheddable, critical := classLimit(0.5), classLimit(1)
			for i := range 10 {
				v, err := c.take("acct", sheddable)
				if err != nil {
					t.Fatal(err)
				}
				if !v.Allowed || v.Shed || v.Remaining != int64(19-i) {
					t.Fatalf("sheddable take %d = %+v, want allowed with %d left", i+1, v, 19-i)
				}
			}
			if c.name == "bucket.lua" {
				p, err := st.Peek(ctx, "acct", "api", sheddable, 1)
				if err != nil {
					t.Fatal(err)
				}
				if p.Allowed || !p.Shed || p.Remaining != 10 {
					t.Fatalf("peek for the sheddable class at the floor = %+v, want shed with 10 left", p)
				}
				if p, _ = st.Peek(ctx, "acct", "api", critical, 1); !p.Allowed || p.Remaining != 9 {
					t.Fatalf("peek for the critical class at the floor = %+v, want allowed with 9 left", p)
				}
			}
			v, err := c.take("acct", sheddable)
			if err != nil {
				t.Fatal(err)
			}
			// 10 tokens left, floor 10: the next token is the floor's, so
			// the class waits for one token: 1,000 s at 0.001 a second.
			if v.Allowed || !v.Shed || v.Remaining != 10 || !aboutOneToken(v.RetryAfter) {
				t.Fatalf("sheddable take at the floor = %+v, want shed, 10 left, retry 1000s", v)
			}
			for i := range 10 {
				v, err := c.take("acct", critical)
				if err != nil {
					t.Fatal(err)
				}
				if !v.Allowed || v.Remaining != int64(9-i) {
					t.Fatalf("critical take %d below the floor = %+v, want allowed with %d left", i+1, v, 9-i)
				}
			}
			v, err = c.take("acct", critical)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed || v.Shed || v.Remaining != 0 || !aboutOneToken(v.RetryAfter) {
				t.Fatalf("critical take of an empty bucket = %+v, want refused for the rate (not shed), retry 1000s", v)
			}
			if v, _ = c.take("acct", sheddable); v.Allowed || v.Shed {
				t.Fatalf("sheddable take of an empty bucket = %+v, want refused for the rate, not shed", v)
			}
		})
	}
}
