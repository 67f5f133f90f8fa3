package slots_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// serverEnv makes the test binary a Go service behind the middleware
// (runServer): "redis-addr prefix ttl-ms".
const serverEnv = "SLOTS_TEST_SERVER"

// runServer serves GET /work behind httpapi.Middleware over a Gate on
// Redis (concurrency 4 per key), each request held until the process
// dies; it prints "listening ADDR".
func runServer(spec string) error {
	f := strings.Fields(spec)
	if len(f) != 3 {
		return fmt.Errorf("server spec %q", spec)
	}
	ttlMS, _ := strconv.Atoi(f[2])
	rdb := redis.NewClient(&redis.Options{Addr: f[0], ContextTimeoutEnabled: true})
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { concurrency: 4 }\n"))
	if err != nil {
		return err
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, f[1]), Policy: pol})
	if err != nil {
		return err
	}
	gate, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, f[1]),
		TTL: time.Duration(ttlMS) * time.Millisecond})
	if err != nil {
		return err
	}
	guard := &httpapi.Guard{Checker: gate, Key: httpapi.HeaderKey("X-Key", "")}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	return http.Serve(ln, httpapi.Middleware(guard)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the work runs until the process dies
	})))
}

// TestKilledServiceSlotsComeBack: a Go service whose handlers hold every
// slot of a key through the middleware (renewing them as they run) is
// SIGKILLed at a random point of its renew cycle. Read from the store
// right after the kill, the leases' ends bound what happens next: no slot
// is given to anyone before the earliest of them, and every slot is back
// once they have passed, with nobody releasing anything.
func TestKilledServiceSlotsComeBack(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	c := redisstore.NewConcurrency(rdb, "svc")
	const n = 4
	ttl := time.Second
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s svc %d", serverEnv, r.Addr(), ttl.Milliseconds()))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		var addr string
		if !lines.Scan() {
			t.Fatal("the service never listened")
		}
		if _, err := fmt.Sscanf(lines.Text(), "listening %s", &addr); err != nil {
			t.Fatalf("service said %q", lines.Text())
		}
		key := fmt.Sprintf("acct-%d", round)
		for range n {
			go func() {
				req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/work", nil)
				req.Header.Set("X-Key", key)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
		setKey := c.SetKey(key, "GET /work")
		deadline := time.Now().Add(time.Minute)
		for {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the service never held %d slots", round, n)
			}
			if h, err := c.Held(context.Background(), rdb, key, "GET /work"); err == nil && h == n {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		// A random point of the renew cycle: what is asserted below does
		// not depend on it.
		time.Sleep(time.Duration(rand.Int64N(int64(ttl))))
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		killed := storeTimeMS(t, rdb)
		ends, err := rdb.ZRangeWithScores(context.Background(), setKey, 0, -1).Result()
		if err != nil || len(ends) == 0 {
			t.Fatalf("round %d: %d leases in the store after the kill, %v", round, len(ends), err)
		}
		// A handler whose renewal came too late on a starved machine lost
		// its lease and gave its slot back before the kill: those slots
		// are free at once; the others wait for their leases' ends.
		free := n - len(ends)
		earliest := int64(ends[0].Score)
		var back []int64
		for len(back) < n {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d of the killed service's %d slots came back", round, len(back), n)
			}
			g, err := c.Acquire(context.Background(), slots.Slot{Key: key, Scope: "GET /work", Member: slots.NewMember()}, n, n, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if !g.Admitted {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if at := g.Now.UnixMilli(); len(back) >= free && at < earliest {
				t.Fatalf("round %d: a slot came back at %d, before the earliest lease end %d", round, at, earliest)
			}
			back = append(back, g.Now.UnixMilli())
		}
		t.Logf("round %d: all %d slots back %d ms after the kill (TTL %v, renew every %v)", round, n, back[n-1]-killed, ttl, slots.RenewInterval(ttl))
	}
}
