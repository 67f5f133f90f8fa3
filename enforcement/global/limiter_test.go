package global_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
)

// globalPolicy resolves every key's limit, Global for key "g" only.
type globalPolicy struct{ lim enforcement.Limit }

func (p globalPolicy) Resolve(key, _, tier string) (limits.Resolved, error) {
	return limits.Resolved{Limit: p.lim, Policy: "t", Tier: "t", Cost: 1, Global: key == "g"}, nil
}

// TestLimiterDecidesGlobalLimitsFromThePool: a limiter with Config.Global
// decides a Global limit there (source shared from the pool, regional on
// the escrow while the home is frozen) and a regional limit on its
// Authority as before.
func TestLimiterDecidesGlobalLimitsFromThePool(t *testing.T) {
	home := startHome(t)
	regions := startRegions(t, home, "a", "b", "c")
	a := regions[0]
	lim := enforcement.Limit{Rate: 1000, Burst: 1000}
	l, err := enforcement.New(enforcement.Config{
		Authority: redisstore.New(client(t, a.redis.Addr()), "t"),
		Global:    a.g, Regions: 3,
		Policy: globalPolicy{lim},
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(key string) enforcement.Decision {
		t.Helper()
		d, err := l.Check(context.Background(), enforcement.Request{Key: key, Scope: "api"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	eventually(t, 10*time.Second, "a global decision allowed from the pool", func() bool {
		d := check("g")
		return d.Allowed && d.Source == enforcement.SourceShared
	})
	if d := check("r"); !d.Allowed || d.Source != enforcement.SourceShared {
		t.Fatalf("regional limit: %+v", d)
	}
	if err := home.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer home.Process().Signal(syscall.SIGCONT)
	eventually(t, 10*time.Second, "a global decision on the escrow, source regional", func() bool {
		d := check("g")
		return d.Allowed && d.Source == enforcement.SourceRegional && d.Source.String() == "regional"
	})
	if d := check("r"); !d.Allowed || d.Source != enforcement.SourceShared {
		t.Fatalf("regional limit while the home is cut: %+v", d)
	}
	home.Process().Signal(syscall.SIGCONT)
	eventually(t, 10*time.Second, "global decisions back on the pool", func() bool {
		return check("g").Source == enforcement.SourceShared
	})
}

// TestColdPoolRejectionWaitsForALease: the first request on a global key
// finds its region's pool empty while the global bucket is full; the
// rejection's retry is the refiller's next lease, not the hour the cost
// takes to refill at the limit's rate, so the limiter asks the pool again
// once that has passed and is answered from the lease: a slow key gets
// its burst.
func TestColdPoolRejectionWaitsForALease(t *testing.T) {
	home := startHome(t)
	a := softRegion(t, home, "a", 2, time.Minute) // stepped by hand: no Run
	lim := enforcement.Limit{Rate: 1.0 / 3600, Burst: 20}
	l, err := enforcement.New(enforcement.Config{
		Authority: redisstore.New(client(t, home.Addr()), "t"),
		Global:    a, Regions: 2,
		Policy: globalPolicy{lim},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func() enforcement.Decision {
		t.Helper()
		d, err := l.Check(ctx, enforcement.Request{Key: "g", Scope: "api"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := check()
	if d.Allowed || d.Source != enforcement.SourceShared {
		t.Fatalf("first request on a cold pool: %+v, want rejected by the pool", d)
	}
	if d.RetryAfter >= time.Minute {
		t.Fatalf("cold pool's retry %v: the cost's refill at the limit's rate, not the next lease", d.RetryAfter)
	}
	// Half the burst is most of what the refiller leases here: it keeps
	// the other region's share of the demand it has not seen at the home.
	var admitted int64
	for i := 0; i < 40 && admitted < lim.Burst/2; i++ {
		if !d.Allowed {
			if d.RetryAfter >= time.Minute {
				t.Fatalf("after %d admitted of a burst of %d: rejected for %v (%+v)", admitted, lim.Burst, d.RetryAfter, d)
			}
			time.Sleep(d.RetryAfter)
		}
		a.Tick(ctx)
		if d = check(); d.Allowed {
			admitted++
		}
	}
	if admitted < lim.Burst/2 {
		t.Fatalf("%d of 40 admitted on a key with burst %d", admitted, lim.Burst)
	}
}
