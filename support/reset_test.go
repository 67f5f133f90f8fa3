package support_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// hammerPolicy: a bucket that does not refill within the test.
type hammerPolicy struct{}

func (hammerPolicy) Resolve(_, _, _ string) (enforcement.Resolved, error) {
	return enforcement.Resolved{Limit: enforcement.Limit{Rate: 0.001, Burst: 20}, Policy: "p", Tier: "t", Cost: 1}, nil
}

// TestResetUnderHammer: four limiters on one Redis hammer a key until
// every one of them rejects it from what it learned; a support refill is
// applied on one of them, and every limiter asks the store again (each
// dropped its local view on the announcement: without that it would go
// on rejecting locally for the bucket's 1000 s refill), and together they
// admit exactly the refilled burst. The refusals — no reason,
// a read identity, a forged key, a replay — are refused with their code
// and, all but the replay, audited.
func TestResetUnderHammer(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sam, _ := policylog.GenerateSigner()
	rita, _ := policylog.GenerateSigner()
	mallory, _ := policylog.GenerateSigner()
	ring, err := policylog.ParseKeyring(strings.NewReader(sam.KeyringLine("sam") + " role=support\n" + rita.KeyringLine("rita") + " role=read\n"))
	if err != nil {
		t.Fatal(err)
	}

	const n = 4
	var lims []*enforcement.Limiter
	var stores []*redisstore.Store
	var wg sync.WaitGroup
	defer wg.Wait()
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 8})
		defer rdb.Close()
		st := redisstore.New(rdb, "rl")
		lim, err := enforcement.New(enforcement.Config{Authority: st, Policy: hammerPolicy{}})
		if err != nil {
			t.Fatal(err)
		}
		lims, stores = append(lims, lim), append(stores, st)
		wg.Add(1)
		go func() { defer wg.Done(); _ = support.Listen(ctx, rdb, "rl", func(k, s string) { lim.Forget(k, s) }) }()
	}
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer admin.Close()
	for {
		m, err := admin.PubSubNumSub(ctx, "rl:resets").Result()
		if err != nil {
			t.Fatal(err)
		}
		if m["rl:resets"] == n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The hammer: two goroutines per limiter, each recording when its
	// limiter last asked the store, and counting what it allowed.
	req := enforcement.Request{Key: "acct", Scope: "api", Cost: 1, HasCost: true}
	lastShared := make([]atomic.Int64, n)
	var allowed atomic.Int64
	hctx, stopHammer := context.WithCancel(ctx)
	var hw sync.WaitGroup
	for i := range n {
		for range 2 {
			hw.Add(1)
			go func() {
				defer hw.Done()
				for hctx.Err() == nil {
					d, err := lims[i].Check(hctx, req)
					if err != nil {
						continue
					}
					if d.Source == enforcement.SourceShared {
						lastShared[i].Store(time.Now().UnixNano())
					}
					if d.Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
	}
	defer func() { stopHammer(); hw.Wait() }()
	// Exhausted everywhere: every limiter's local view knows the bucket empty.
	deadline := time.Now().Add(20 * time.Second)
	for i := range n {
		for !lims[i].LocalView("acct", "api").StoreKnown || lims[i].LocalView("acct", "api").StoreTokens >= 1 {
			if time.Now().After(deadline) {
				t.Fatalf("limiter %d never learned the bucket empty: %+v", i, lims[i].LocalView("acct", "api"))
			}
			time.Sleep(time.Millisecond)
		}
	}

	rs := &support.Resetter{Keys: ring, Policy: func() enforcement.Policy { return hammerPolicy{} }, Instance: "limiter-0",
		Stores: []support.StoreRef{{Store: stores[0]}}, Forget: func(k, s string) { lims[0].Forget(k, s) }}
	sign := func(s *policylog.Signer, reason, id string) support.SignedReset {
		sr, err := support.Sign(s, support.ResetRequest{ID: id, Key: "acct", Scope: "api", Op: redisstore.ResetRefill, Reason: reason, Time: time.Now().UTC()})
		if err != nil {
			t.Fatal(err)
		}
		return sr
	}
	refused := func(sr support.SignedReset, code string) {
		t.Helper()
		_, err := rs.Apply(ctx, sr)
		var ref *support.Refused
		if !errors.As(err, &ref) || ref.Code != code {
			t.Fatalf("want refused %s, got %v", code, err)
		}
	}
	refused(sign(sam, "  ", "a"), support.CodeReasonRequired)
	refused(sign(rita, "looks wrong", "b"), support.CodeForbidden)
	refused(sign(mallory, "trust me", "c"), support.CodeUnauthenticated)
	forged := sign(sam, "ok", "d")
	forged.Doc = strings.Replace(forged.Doc, `"refill"`, `"quota"`, 1)
	refused(forged, support.CodeUnauthenticated)

	good := sign(sam, "ticket 4411", "e")
	before := allowed.Load()
	sent := time.Now()
	rec, err := rs.Apply(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	var a support.Audit
	if err := json.Unmarshal(rec, &a); err != nil || a.Author != "sam" || a.Role != policylog.RoleSupport || a.Result != "applied" {
		t.Fatalf("record %s: %v", rec, err)
	}
	for i := range n {
		for lastShared[i].Load() < sent.UnixNano() {
			if time.Now().After(sent.Add(20 * time.Second)) {
				t.Fatalf("limiter %d never asked the store after the reset: it still answers from its old view", i)
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("limiter %d asked the store %v after the reset was sent", i, time.Unix(0, lastShared[i].Load()).Sub(sent))
	}
	for allowed.Load()-before < 20 {
		if time.Now().After(sent.Add(20 * time.Second)) {
			t.Fatalf("after the refill the fleet admitted %d, want the burst of 20", allowed.Load()-before)
		}
		time.Sleep(time.Millisecond)
	}
	stopHammer()
	hw.Wait()
	if got := allowed.Load() - before; got > 21 { // 20, and a token refilled at most
		t.Fatalf("after the refill the fleet admitted %d, more than the burst of 20", got)
	}
	refused(good, support.CodeReplayed)

	kv, err := stores[0].Inspect(ctx, "acct", "api", enforcement.Limit{Rate: 0.001, Burst: 20}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, raw := range kv.Resets {
		var a support.Audit
		_ = json.Unmarshal(raw, &a)
		codes = append(codes, a.Result+":"+a.Code)
	}
	want := []string{"applied:", "refused:unauthenticated", "refused:unauthenticated", "refused:forbidden", "refused:reason_required"}
	if strings.Join(codes, ",") != strings.Join(want, ",") {
		t.Fatalf("audit, newest first: %v, want %v", codes, want)
	}
}
