package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestLeaseContract: the whole chain the limiter asks — leasing, in front
// of the shared store with its guards — decides as every authority must.
// The suite's keys are cold (a few decisions each), so they pass to the
// store: leasing must not change what a cold key is told.
func TestLeaseContract(t *testing.T) {
	r := testenv.StartRedis(t)
	s := redisstore.NewShared(client(t, r), redisstore.SharedConfig{Prefix: "leasesuite",
		Guard: redisstore.GuardSettings{Timeout: 5 * time.Second}})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = s.Run(ctx) }()
	a := lease.New(s, s, lease.Config{Timeout: 5 * time.Second})
	t.Cleanup(func() { cancel(); <-ran }) // after running's cleanup: the leases go back first
	running(t, a)
	authoritytest.Run(t, a)
}
