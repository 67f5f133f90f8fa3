package redisstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestInspectAndReset: inspect reads a bucket in debt, its quota and a
// split key's sub-buckets without writing; each reset operation changes
// exactly what it names, records before and after, applies once per id
// and is announced on the reset channel.
func TestInspectAndReset(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	s := redisstore.New(rdb, "support")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 0.001, Burst: 10, QuotaLimit: 100, QuotaPeriod: enforcement.PeriodDay, QuotaID: "day"}

	// A bucket 3 tokens in debt, as a settle above the estimate leaves it.
	bkey := s.BucketKey("acct", "api")
	now := time.Now().UnixMicro()
	if err := rdb.Set(ctx, bkey, redisstore.EncodeBucket(enforcement.Bucket{Tokens: -3, TS: now}), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(ctx, "other", "api", lim, 0); err != nil {
		t.Fatal(err)
	}
	start, _ := lim.QuotaPeriod.Window(time.Now())
	if err := rdb.Set(ctx, s.QuotaKey("acct", "day", start), 42, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	before, _ := rdb.Get(ctx, bkey).Result()
	kv, err := s.Inspect(ctx, "acct", "api", lim, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !kv.Bucket.Present || kv.Bucket.Debt < 2.9 || kv.Bucket.Debt > 3 || kv.Bucket.Capacity != 10 || kv.Bucket.TTLms <= 0 {
		t.Fatalf("bucket in debt: %+v", kv.Bucket)
	}
	if kv.Quota == nil || kv.Quota.Used != 42 || kv.Quota.Left != 58 {
		t.Fatalf("quota: %+v, want 42 used", kv.Quota)
	}
	if after, _ := rdb.Get(ctx, bkey).Result(); after != before {
		t.Fatal("inspect wrote the bucket")
	}

	sub := rdb.Subscribe(ctx, keyslot.ResetChannel("support"))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription is in place
		t.Fatal(err)
	}
	reset := func(op redisstore.ResetOp, grant int64, id string) (before, after struct{ Tokens, QuotaUsed float64 }) {
		t.Helper()
		rec, err := s.Reset(ctx, "acct", "api", lim, op, grant, id, []byte(`{"author":"sam","reason":"r"}`))
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		var a struct {
			Author        string
			Before, After struct{ Tokens, QuotaUsed float64 }
		}
		if err := json.Unmarshal(rec, &a); err != nil || a.Author != "sam" {
			t.Fatalf("%s record %s: %v", op, rec, err)
		}
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k, sc, ok := redisstore.ParseAnnouncement(msg.Payload); !ok || k != "acct" || sc != "api" {
			t.Fatalf("announcement %q", msg.Payload)
		}
		return a.Before, a.After
	}
	if b, a := reset(redisstore.ResetClearDebt, 0, "1"); b.Tokens > -2.9 || math.Abs(a.Tokens) > 1e-9 {
		t.Fatalf("clear-debt: %+v → %+v, want -3 → 0", b, a)
	}
	if b, a := reset(redisstore.ResetGrant, 4, "2"); math.Abs(a.Tokens-b.Tokens-4) > 0.01 {
		t.Fatalf("grant 4: %+v → %+v", b, a)
	}
	if b, a := reset(redisstore.ResetQuota, 0, "3"); b.QuotaUsed != 42 || a.QuotaUsed != 0 {
		t.Fatalf("quota: %+v → %+v, want 42 → 0", b, a)
	}
	if _, a := reset(redisstore.ResetRefill, 0, "4"); a.Tokens != 10 {
		t.Fatalf("refill: after %+v, want 10", a)
	}
	if _, err := s.Reset(ctx, "acct", "api", lim, redisstore.ResetRefill, 0, "4", []byte(`{}`)); !errors.Is(err, redisstore.ErrResetApplied) {
		t.Fatalf("the same id again: %v, want ErrResetApplied", err)
	}
	kv, err = s.Inspect(ctx, "acct", "api", lim, 10)
	if err != nil {
		t.Fatal(err)
	}
	if kv.Bucket.Present || kv.Bucket.Tokens != 10 || kv.Quota.Used != 0 || len(kv.Resets) != 4 {
		t.Fatalf("after the resets: bucket %+v, quota %+v, %d audit records; want full, 0 used, 4", kv.Bucket, kv.Quota, len(kv.Resets))
	}

	// A split key: each sub-bucket, at a fraction of the limit.
	hot := enforcement.Limit{Rate: 10, Burst: 40, Split: 4}
	for i := range 4 {
		if _, err := s.Take(ctx, split.SubKey("hot", i), "api", split.SubLimit(hot), int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	kv, err = s.Inspect(ctx, "hot", "api", hot, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(kv.Split) != 4 {
		t.Fatalf("split: %d sub-buckets, want 4", len(kv.Split))
	}
	for i, b := range kv.Split {
		if b.Capacity != 10 || b.Tokens < float64(10-i-1) || b.Tokens > 10 || b.RedisKey != s.BucketKey(split.SubKey("hot", i), "api") {
			t.Errorf("sub-bucket %d: %+v, want about %d of 10", i, b, 10-i-1)
		}
	}
}
