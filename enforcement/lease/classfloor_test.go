package lease_test

import (
	"context"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestClassBelowShareOneAsksTheStore: once a key is hot and spends leased
// tokens in process, a request of a class below share 1 still asks the
// store, which keeps its floor: the tokens leased out count as spent, so
// the class is shed no later than without leases.
func TestClassBelowShareOneAsksTheStore(t *testing.T) {
	r := testenv.StartRedis(t)
	c := client(t, r)
	store := redisstore.New(c, "leasefloor")
	a := lease.New(store, store, lease.Config{Block: 20, HotOpsPerSec: 5})
	stop := running(t, a)
	defer func() { _ = stop() }()
	ctx := context.Background()
	critical := enforcement.Limit{Rate: 0.001, Burst: 100}
	sheddable := critical
	sheddable.Share = 0.5
	inProcess := false
	for i := 0; i < 40 && !inProcess; i++ {
		v, err := a.Take(ctx, "hot", "s", critical, 1)
		if err != nil || !v.Allowed {
			t.Fatalf("critical take %d: %+v, %v", i+1, v, err)
		}
		inProcess = v.InProcess
	}
	if !inProcess {
		t.Fatal("the key never spent leased tokens in process: nothing to test")
	}
	for {
		v, err := a.Take(ctx, "hot", "s", sheddable, 1)
		if err != nil {
			t.Fatal(err)
		}
		if v.InProcess {
			t.Fatalf("a class below share 1 spent leased tokens in process: %+v", v)
		}
		if !v.Allowed {
			if !v.Shed || v.Remaining != 50 {
				t.Fatalf("sheddable refused: %+v; want shed with the floor's 50 tokens left in the store", v)
			}
			break
		}
	}
}
