package global

import (
	"math"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// TestDemandRateFollows: a steady demand is learned within a few windows,
// and a demand that stops decays toward 0 as fast: the pools follow a
// shift within a second (window 200ms).
func TestDemandRateFollows(t *testing.T) {
	const tick, window = 50 * time.Millisecond, 200 * time.Millisecond
	rate := 0.0
	for i := 0; i < 20; i++ { // 1 s of 300 tokens/s
		rate = demandRate(rate, 15, tick, window)
	}
	if math.Abs(rate-300) > 300*0.01 {
		t.Fatalf("after 1 s at 300/s: %v", rate)
	}
	for i := 0; i < 20; i++ { // 1 s of nothing
		rate = demandRate(rate, 0, tick, window)
	}
	if rate > 300*0.01 {
		t.Fatalf("after 1 s idle: %v", rate)
	}
	if got := demandRate(7, 100, 0, window); got != 7 {
		t.Fatalf("dt 0 changed the rate: %v", got)
	}
	if got := demandRate(0, -5, tick, window); got != 0 {
		t.Fatalf("a counter that went back (a pool recreated) is demand: %v", got)
	}
}

func TestHorizonAndPoolMax(t *testing.T) {
	const tick = 50 * time.Millisecond
	if h := horizon(150*time.Millisecond, tick); h != 250*time.Millisecond {
		t.Fatalf("horizon(150ms) = %v", h)
	}
	if h := horizon(10*time.Second, tick); h != maxHorizon {
		t.Fatalf("horizon is not capped: %v", h)
	}
	lim := enforcement.Limit{Rate: 1000, Burst: 500}
	for _, c := range []struct {
		h       time.Duration
		maxCost int64
		want    int64
	}{
		{250 * time.Millisecond, 1, 250}, // rate × horizon
		{2 * time.Second, 1, 500},        // never more than the burst
		{time.Millisecond, 1, 1},         // at least one token
		{time.Millisecond, 40, 40},       // at least the largest cost seen
		{time.Millisecond, 900, 500},     // the burst still caps it
	} {
		if got := poolMax(lim, c.h, c.maxCost); got != c.want {
			t.Errorf("poolMax(%v, cost %d) = %d, want %d", c.h, c.maxCost, got, c.want)
		}
	}
	// Below rate × RTT ≈ 100 tokens the pool is small: 100/s over 250ms is 25.
	if got := poolMax(enforcement.Limit{Rate: 100, Burst: 100}, 250*time.Millisecond, 1); got != 25 {
		t.Errorf("small limit: %d", got)
	}
}

func TestTargetAndPlan(t *testing.T) {
	lim := enforcement.Limit{Rate: 1000, Burst: 500}
	h := 250 * time.Millisecond
	if got := target(0, lim, h, 1); got != 0 {
		t.Errorf("no demand: target %d", got)
	}
	if got := target(100, lim, h, 1); got != 25 {
		t.Errorf("100/s: target %d, want 25", got)
	}
	if got := target(3000, lim, h, 1); got != 250 {
		t.Errorf("3× the limit: target %d, want the pool max 250", got)
	}
	if got := target(1, lim, h, 10); got != 10 {
		t.Errorf("a trickle of cost-10 requests: target %d, want 10", got)
	}
	const hold = 250 * time.Millisecond
	for _, c := range []struct {
		tokens, tgt, floor int64
		idle               time.Duration
		want               plan
	}{
		{0, 25, 1, 0, plan{lease: 25}},
		{10, 25, 1, 0, plan{lease: 15}},
		{25, 25, 1, 0, plan{}},
		{50, 25, 1, 0, plan{}},                      // within twice the target: kept
		{80, 25, 1, 0, plan{giveUp: 55}},            // demand fell: the excess goes back
		{80, 25, 1, hold, plan{giveUp: 79}},         // idle: all but the floor goes back
		{0, 0, 3, hold, plan{lease: 3}},             // an idle key keeps its floor
		{1, 0, 1, hold, plan{}},                     // and no more
		{5, 0, 1, idleHold * hold, plan{giveUp: 5}}, // idle for long: everything goes back
		{0, 0, 1, idleHold * hold, plan{}},
		{-40, 25, 1, 0, plan{lease: 65}},              // in debt: the debt and the target
		{-40, 0, 3, hold, plan{lease: 43}},            // idle in debt: the debt and the floor
		{-40, 0, 1, idleHold * hold, plan{lease: 40}}, // idle for long: the debt still
	} {
		if got := planFor(c.tokens, c.tgt, c.floor, c.idle, hold); got != c.want {
			t.Errorf("planFor(%d, %d, floor %d, idle %v) = %+v, want %+v", c.tokens, c.tgt, c.floor, c.idle, got, c.want)
		}
	}
}

func TestEscrowShare(t *testing.T) {
	r, b := escrowOf(enforcement.Limit{Rate: 100, Burst: 100}, 3)
	if math.Abs(r-100.0/3) > 1e-9 || b != 33 {
		t.Fatalf("escrow of 100/100 over 3: %v %d", r, b)
	}
	if _, b := escrowOf(enforcement.Limit{Rate: 1, Burst: 2}, 3); b != 1 {
		t.Fatalf("a burst below N still allows one: %d", b)
	}
}
