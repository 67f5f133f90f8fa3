package slots_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// markedGate is gateOn's Gate with full marks lasting fullFor, and a
// store deadline long enough that no call is decided degraded.
func markedGate(t *testing.T, addr, prefix string, ttl, fullFor time.Duration) *slots.Gate {
	t.Helper()
	p, err := policy.Parse([]byte(gatePolicy))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, prefix), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	g, err := slots.NewGate(slots.Config{
		Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, prefix),
		TTL: ttl, Timeout: testenv.Timeout(5 * time.Second), FullFor: fullFor, // never degraded on a slow machine
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func mustCheck(t *testing.T, g *slots.Gate, key, priority string) enforcement.Decision {
	t.Helper()
	d, err := g.Check(context.Background(), reportReq(key, priority))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestFullMarkRefusesInProcess: once the store has refused a key's slot,
// the requests behind it are refused in process (source local) with no
// store call, shown with the store frozen: without the mark they would
// have been decided degraded and admitted. A class of share 1 under
// lower classes is never refused on a mark, and a release through this
// limiter clears the mark at once.
func TestFullMarkRefusesInProcess(t *testing.T) {
	r := testenv.StartRedis(t)
	g := markedGate(t, r.Addr(), "marked", time.Minute, testenv.Timeout(10*time.Second))
	var leases []string
	for i := range 4 {
		d := mustCheck(t, g, "acct", "critical")
		if !d.Allowed || d.Source != enforcement.SourceShared {
			t.Fatalf("critical %d: %+v", i, d)
		}
		leases = append(leases, d.Lease)
	}
	if d := mustCheck(t, g, "acct", "default"); d.Allowed || d.Source != enforcement.SourceShared || d.Reason != enforcement.ReasonConcurrency {
		t.Fatalf("the store's refusal: %+v", d)
	}

	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = r.Process().Signal(syscall.SIGCONT)
		}
	}()
	for _, class := range []string{"default", "sheddable"} {
		d := mustCheck(t, g, "acct", class)
		if d.Allowed || d.Source != enforcement.SourceLocal || d.Reason != enforcement.ReasonConcurrency || d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
			t.Fatalf("%s with the store frozen: %+v (want refused in process)", class, d)
		}
	}
	if err := r.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false

	// Critical's share is a guarantee: it asks the store.
	if d := mustCheck(t, g, "acct", "critical"); d.Allowed || d.Source != enforcement.SourceShared {
		t.Fatalf("critical on a mark: %+v (want the store's refusal)", d)
	}
	// A release here: the store is asked again, and refuses default at
	// its share (3 of 4 held); that refusal marks 3 held, which refuses
	// sheddable (share 2) in process, "shed".
	if freed, err := g.Release(context.Background(), leases[0]); err != nil || !freed {
		t.Fatalf("release: %v %v", freed, err)
	}
	if d := mustCheck(t, g, "acct", "default"); d.Allowed || d.Source != enforcement.SourceShared || d.Reason != enforcement.ReasonShed {
		t.Fatalf("default after a release: %+v", d)
	}
	if d := mustCheck(t, g, "acct", "sheddable"); d.Allowed || d.Source != enforcement.SourceLocal || d.Reason != enforcement.ReasonShed {
		t.Fatalf("sheddable on the new mark: %+v", d)
	}
	if freed, err := g.Release(context.Background(), leases[1]); err != nil || !freed {
		t.Fatalf("release: %v %v", freed, err)
	}
	if d := mustCheck(t, g, "acct", "default"); !d.Allowed || d.Source != enforcement.SourceShared {
		t.Fatalf("default with 2 of 4 held: %+v", d)
	}
}

// TestFullMarkBounds: a slot released through another limiter is refused
// here on a mark only by calls that start within FullFor of the refusal
// that set it; and no call is refused on a mark once the earliest lease
// the store reported has ended, so a holder that never renews loses its
// slot exactly as without marks.
func TestFullMarkBounds(t *testing.T) {
	r := testenv.StartRedis(t)
	const fullFor = 200 * time.Millisecond

	t.Run("release elsewhere", func(t *testing.T) {
		a := markedGate(t, r.Addr(), "elsewhere", time.Minute, fullFor)
		b := markedGate(t, r.Addr(), "elsewhere", time.Minute, fullFor)
		var leases []string
		for range 4 {
			d := mustCheck(t, b, "acct", "critical")
			if !d.Allowed || d.Source != enforcement.SourceShared {
				t.Fatalf("fill: %+v", d)
			}
			leases = append(leases, d.Lease)
		}
		if d := mustCheck(t, a, "acct", "default"); d.Allowed || d.Source != enforcement.SourceShared {
			t.Fatalf("the store's refusal: %+v", d)
		}
		start := time.Now() // after the refused call began: its mark ends by start + fullFor
		for _, l := range leases[:2] {
			if freed, err := b.Release(context.Background(), l); err != nil || !freed {
				t.Fatalf("release on the other limiter: %v %v", freed, err)
			}
		}
		testenv.WaitFor(t, testenv.Timeout(10*time.Second), "the slot released elsewhere admitted", func() bool {
			at := time.Now()
			d := mustCheck(t, a, "acct", "default")
			if !d.Allowed && (d.Source != enforcement.SourceLocal || at.Sub(start) >= fullFor) {
				t.Fatalf("refused %v after the store's refusal, bound %v: %+v", at.Sub(start), fullFor, d)
			}
			return d.Allowed
		})
	})

	t.Run("lease ends", func(t *testing.T) {
		// FullFor is as long as it may be (a renew interval); the leases
		// end before any mark could.
		g := markedGate(t, r.Addr(), "ends", slots.MinTTL, time.Hour)
		for range 4 {
			if d := mustCheck(t, g, "acct", "critical"); !d.Allowed || d.Source != enforcement.SourceShared {
				t.Fatalf("fill: %+v", d)
			}
		}
		var leaseEnd time.Time // the earliest lease's end, as the store last said
		testenv.WaitFor(t, testenv.Timeout(10*time.Second), "a slot whose lease ended admitted", func() bool {
			at := time.Now()
			d := mustCheck(t, g, "acct", "default")
			switch {
			case d.Allowed:
				return true
			case d.Source == enforcement.SourceShared:
				// From after the call: the lease ends no later.
				leaseEnd = time.Now().Add(d.RetryAfter)
			case d.Source == enforcement.SourceLocal && !at.Before(leaseEnd):
				t.Fatalf("refused on a mark %v after the earliest lease ended: %+v", at.Sub(leaseEnd), d)
			}
			return false
		})
	})
}

// BenchmarkFullKeyFlood: requests of the default class against a key
// whose four slots are held, on redis-server, with full marks (the
// default FullFor) and without; store-calls/op is the scripts Redis ran
// per request (INFO commandstats).
func BenchmarkFullKeyFlood(b *testing.B) {
	r := testenv.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	for _, c := range []struct {
		name    string
		fullFor time.Duration
	}{{"marks", 0}, {"no-marks", -1}} {
		b.Run(c.name, func(b *testing.B) {
			p, err := policy.Parse([]byte(gatePolicy))
			if err != nil {
				b.Fatal(err)
			}
			lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, c.name), Policy: p})
			if err != nil {
				b.Fatal(err)
			}
			g, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, c.name),
				TTL: time.Hour, FullFor: c.fullFor})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			key := slots.NewMember() // the body runs once per b.N tried
			for range 4 {
				if d, err := g.Check(ctx, reportReq(key, "critical")); err != nil || !d.Allowed {
					b.Fatalf("fill: %+v %v", d, err)
				}
			}
			before := scriptCalls(b, rdb)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, err := g.Check(ctx, reportReq(key, "default")); err != nil || d.Allowed {
						b.Errorf("a full key: %+v %v", d, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(scriptCalls(b, rdb)-before)/float64(b.N), "store-calls/op")
		})
	}
}

// scriptCalls is how many scripts Redis has run (EVALSHA and EVAL).
func scriptCalls(tb testing.TB, rdb *redis.Client) int64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				total += n
			}
		}
	}
	return total
}
