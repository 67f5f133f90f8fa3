package ratelimitheader_test

import (
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
)

// A decision of the rule "pro" (100 tokens a second, burst 200, a monthly
// quota of 100 million) written as the draft's two fields.
func Example() {
	now := time.Date(2026, 11, 14, 12, 0, 0, 0, time.UTC)
	d := enforcement.Decision{
		Allowed: true, Policy: "pro", Cost: 1,
		Bucket: enforcement.BucketState{Rate: 100, Burst: 200, Remaining: 57, ResetAt: now.Add(1430 * time.Millisecond)},
		Quota: enforcement.QuotaState{Limit: 100_000_000, Period: enforcement.PeriodMonth, Known: true,
			Remaining: 99_000_000, ResetAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
	}
	fmt.Printf("RateLimit-Policy: %s\n", ratelimitheader.AppendPolicy(nil, &d, now))
	fmt.Printf("RateLimit: %s\n", ratelimitheader.AppendRateLimit(nil, &d, now))
	// Output:
	// RateLimit-Policy: "pro";q=200;w=2, "pro-quota";q=100000000;w=2592000
	// RateLimit: "pro";r=57;t=2, "pro-quota";r=99000000;t=1425600
}
