package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/testenv"
)

// TestBatchReportNamesTheBatch: a decision that carries a BatchReport
// learns how many decisions shared its round trip. MinBatch holds the
// batch until all four callers are queued (MaxDelay is far beyond any
// machine's scheduling delay), so the size is exact, not timing-dependent.
func TestBatchReportNamesTheBatch(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	lim := enforcement.Limit{Rate: 1, Burst: 10}

	lone := newPipelined(t, rdb, "breport1")
	var rep redisstore.BatchReport
	if _, err := lone.Take(redisstore.WithBatchReport(context.Background(), &rep), "k", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	if rep.Size != 1 {
		t.Fatalf("a lone decision: batch size %d, want 1", rep.Size)
	}

	p := redisstore.NewPipelined(rdb, "breport4", redisstore.PipelineConfig{MinBatch: 4, MaxDelay: time.Minute})
	running(t, p)
	reps := make([]redisstore.BatchReport, 4)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(redisstore.WithBatchReport(context.Background(), &reps[i]), 2*time.Minute)
			defer cancel()
			if _, err := p.Take(ctx, fmt.Sprintf("k%d", i), "s", lim, 1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, rep := range reps {
		if rep.Size != 4 {
			t.Errorf("decision %d: batch size %d, want 4", i, rep.Size)
		}
	}
}
