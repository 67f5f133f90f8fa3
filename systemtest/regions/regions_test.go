package regions

import (
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The bounds these tests hold a global limit to (enforcement/global's
// over-admission bound):
//
//	admitted over d, every region that reaches the home  ≤ burst + rate × d + N × pool_max
//	admitted on the escrow by a cut-off region over d    ≤ burst/N + rate/N × d
//	  plus what its pool held when it was cut           ≤ pool_max
//
// with pool_max ≤ min(burst, rate × 1 s), the most a pool holds at the
// largest horizon, and 2 % for the clocks of the test and the limiters
// not being one. Without a global limit the three regions would admit
// 3 × (burst + rate × d).
const (
	n       = 3
	margin  = 1.02
	poolMax = min(burst, rate)
)

func globalBound(d time.Duration) float64 {
	return margin * (burst + rate*d.Seconds() + n*poolMax)
}
func escrowBound(d time.Duration) float64 { return margin * (burst/n + rate/n*d.Seconds()) }

// noneDegraded fails the test when a region answered degraded or failed.
func noneDegraded(t *testing.T, name string, ta *tally) {
	t.Helper()
	if ta.errs > 0 || ta.bySource["degraded"] > 0 {
		t.Errorf("region %s: %s: want no error and no degraded decision", name, ta)
	}
}

// A global limit is held within its bound across three regions sending
// three times the limit between them, and the regions share it.
func TestGlobalLimitHeldAcrossThreeRegions(t *testing.T) {
	bed := startBed(t)
	a, b, c := bed.Region("a"), bed.Region("b"), bed.Region("c")
	res, d := run(map[*testenv.Region]float64{a: rate, b: rate, c: rate}, "g", 4*time.Second)
	total, sent, escrow := 0, 0, 0
	for _, r := range []*testenv.Region{a, b, c} {
		ta := res[r]
		t.Logf("region %s: %s", r.Name, ta)
		noneDegraded(t, r.Name, ta)
		total += ta.admitted
		sent += ta.sent
		escrow += ta.admitBy["regional"]
		if ta.admitted == 0 {
			t.Errorf("region %s admitted nothing: the budget is not shared", r.Name)
		}
	}
	// Escrow decisions are the one way past the global bucket; each
	// region's are bounded on their own.
	if limit := globalBound(d) + float64(escrow); float64(total) > limit {
		t.Errorf("admitted %d in %v across 3 regions (%d of them on the escrow), over the bound %.0f", total, d, escrow, limit)
	}
	for _, r := range []*testenv.Region{a, b, c} {
		if e := res[r].admitBy["regional"]; float64(e) > escrowBound(d) {
			t.Errorf("region %s admitted %d on its escrow in %v, over burst/N + rate/N × d = %.0f", r.Name, e, d, escrowBound(d))
		}
	}
	// And it is a limit, not a wall: at least half of what the limit
	// allows (or of what the test managed to send) is admitted.
	if want := 0.5 * min(float64(sent), rate*d.Seconds()); float64(total) < want {
		t.Errorf("admitted %d of %d sent in %v: under half the limit's %.0f", total, sent, d, rate*d.Seconds())
	}
}

// When the demand moves from region b to region c, the budget follows: a
// second after the move c is admitted at the limit's rate, and the limit
// holds over both phases.
func TestDemandMovesBetweenRegions(t *testing.T) {
	bed := startBed(t)
	b, c := bed.Region("b"), bed.Region("c")
	start := time.Now()
	first, _ := run(map[*testenv.Region]float64{b: 2 * rate}, "g", 3*time.Second)
	moved := time.Now()
	second, _ := run(map[*testenv.Region]float64{c: 2 * rate}, "g", 3*time.Second)
	d := time.Since(start)
	t.Logf("b first: %s", first[b])
	t.Logf("c then: %s", second[c])
	noneDegraded(t, "b", first[b])
	noneDegraded(t, "c", second[c])
	if total := first[b].admitted + second[c].admitted; float64(total) > globalBound(d)+float64(first[b].admitBy["regional"]+second[c].admitBy["regional"]) {
		t.Errorf("admitted %d in %v, over the bound %.0f", total, d, globalBound(d))
	}
	// From one second after the move to the end: 2 s at the limit's rate.
	from, to := moved.Add(time.Second), time.Now()
	got := second[c].admittedBetween(from, to)
	sentThen := second[c].sent * int(to.Sub(from)) / int(to.Sub(moved)) // about: the sends are paced
	if want := 0.5 * min(float64(sentThen), rate*to.Sub(from).Seconds()); float64(got) < want {
		t.Errorf("region c admitted %d in the %v from a second after the demand moved to it: under half the limit (%.0f)", got, to.Sub(from), want)
	}
}

// A region cut off from the others decides on what its pool held and
// then on its escrow (source "regional", at most burst/N + rate/N × d),
// says so in /readyz without failing readiness, and rejoins by itself
// when healed; the regions that still reach the home stay ok, never
// degraded.
func TestRegionCutOffDecidesOnEscrowAndRejoins(t *testing.T) {
	bed := startBed(t)
	a, b, c := bed.Region("a"), bed.Region("b"), bed.Region("c")
	demand := map[*testenv.Region]float64{a: rate / 2, b: 1.5 * rate, c: rate / 2}
	warm, _ := run(demand, "g", 2*time.Second)
	for _, r := range []*testenv.Region{a, b, c} {
		noneDegraded(t, r.Name, warm[r])
	}

	bed.Cut("b")
	cutAt := time.Now()
	unreachable := false
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		unreachable = waitFor(15*time.Second, func() bool {
			block, status := regionBlock(t, b)
			if status != 200 {
				t.Errorf("region b's /readyz answered %d while cut off: a cut is not a readiness failure", status)
			}
			return block["global"] == "unreachable"
		})
		<-stop
	}()
	cut, _ := run(demand, "g", cutRun())
	close(stop)
	<-done
	healAt := time.Now()
	d := healAt.Sub(cutAt)
	for _, r := range []*testenv.Region{a, c} {
		t.Logf("region %s while b was cut off: %s", r.Name, cut[r])
		noneDegraded(t, r.Name, cut[r])
		if n := cut[r].bySource["regional"]; n > 0 {
			t.Errorf("region %s made %d decisions on its escrow while only b was cut off", r.Name, n)
		}
		block, status := regionBlock(t, r)
		if status != 200 || block["global"] != "ok" {
			t.Errorf("region %s while b is cut off: /readyz %d, region %v; want 200 and global ok", r.Name, status, block)
		}
	}
	t.Logf("region b while cut off: %s", cut[b])
	noneDegraded(t, "b", cut[b])
	if !unreachable {
		t.Errorf("region b's /readyz never said global \"unreachable\" while cut off")
	}
	if cut[b].bySource["regional"] == 0 {
		t.Errorf("region b cut off for %v made no decision on its escrow (source regional)", d)
	}
	if limit := escrowBound(d) + poolMax; float64(cut[b].admitted) > limit {
		t.Errorf("region b admitted %d in %v cut off, over its escrow share and pool (%.0f)", cut[b].admitted, d, limit)
	}

	bed.Heal("b")
	rejoined := waitFor(20*time.Second, func() bool {
		block, _ := regionBlock(t, b)
		dec, err := b.Check("g", "api", 1)
		return block["global"] == "ok" && err == nil && dec.Source != "regional"
	})
	if !rejoined {
		block, _ := regionBlock(t, b)
		dec, err := b.Check("g", "api", 1)
		t.Errorf("region b did not rejoin within 20 s of the heal: /readyz region %v, a decision %+v %v", block, dec, err)
	}
}

// cutRun is how long traffic runs during a cut: the limiters' home
// timeout to notice it, then seconds on the escrow.
func cutRun() time.Duration { return testenv.RegionHomeTimeout() + 4*time.Second }

// A region that dies with the budget its pool held gives it back: the
// home's bucket refills it, so a second after region b is killed the
// demand that moved to region a is admitted at the limit's rate.
func TestRegionKilledReleasesItsBudget(t *testing.T) {
	bed := startBed(t)
	a, b := bed.Region("a"), bed.Region("b")
	before, _ := run(map[*testenv.Region]float64{b: 2 * rate}, "g", 2*time.Second)
	t.Logf("region b before it dies: %s", before[b])
	noneDegraded(t, "b", before[b])
	b.Kill()
	killed := time.Now()
	after, _ := run(map[*testenv.Region]float64{a: 2 * rate}, "g", 4*time.Second)
	t.Logf("region a after b died: %s", after[a])
	noneDegraded(t, "a", after[a])
	from, to := killed.Add(2*time.Second), time.Now()
	got := after[a].admittedBetween(from, to)
	sentThen := after[a].sent * int(to.Sub(from)) / int(to.Sub(killed))
	if want := 0.5 * min(float64(sentThen), rate*to.Sub(from).Seconds()); float64(got) < want {
		t.Errorf("region a admitted %d in the %v from 2 s after b died: under half the limit (%.0f): b's budget did not come back", got, to.Sub(from), want)
	}
	if block, status := regionBlock(t, a); status != 200 || block["global"] != "ok" {
		t.Errorf("region a after b died: /readyz %d, region %v", status, block)
	}
}

// The home region cut off: every other region decides on its escrow
// (each at most burst/N + rate/N × d), none degraded, while the home
// keeps deciding on its own bucket; the regions rejoin after the heal.
func TestHomeRegionCutOff(t *testing.T) {
	bed := startBed(t)
	a, b, c := bed.Region("a"), bed.Region("b"), bed.Region("c")
	demand := map[*testenv.Region]float64{a: rate / 2, b: 1.5 * rate, c: 1.5 * rate}
	run(demand, "g", 1500*time.Millisecond)
	bed.Cut("a")
	cutAt := time.Now()
	cut, d := run(demand, "g", cutRun())
	d = time.Since(cutAt)
	for _, r := range []*testenv.Region{a, b, c} {
		t.Logf("region %s while the home is cut off: %s", r.Name, cut[r])
		noneDegraded(t, r.Name, cut[r])
	}
	if n := cut[a].bySource["regional"]; n > 0 {
		t.Errorf("the home made %d decisions on an escrow: it reaches its own bucket", n)
	}
	for _, r := range []*testenv.Region{b, c} {
		if cut[r].bySource["regional"] == 0 {
			t.Errorf("region %s made no decision on its escrow while the home was cut off", r.Name)
		}
		if limit := escrowBound(d) + poolMax; float64(cut[r].admitted) > limit {
			t.Errorf("region %s admitted %d in %v with the home cut off, over its escrow share and pool (%.0f)", r.Name, cut[r].admitted, d, limit)
		}
		if _, status := regionBlock(t, r); status != 200 {
			t.Errorf("region %s: /readyz %d with the home cut off: not a readiness failure", r.Name, status)
		}
	}
	bed.Heal("a")
	for _, r := range []*testenv.Region{b, c} {
		if !waitFor(20*time.Second, func() bool {
			block, _ := regionBlock(t, r)
			dec, err := r.Check("g", "api", 1)
			return block["global"] == "ok" && err == nil && dec.Source != "regional"
		}) {
			t.Errorf("region %s did not rejoin within 20 s of the home's heal", r.Name)
		}
	}
}
