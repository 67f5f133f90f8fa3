package slots_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// holderEnv makes the test binary a slot holder (runHolder) instead of
// running the tests: "addr prefix key n ttl-ms".
const holderEnv = "SLOTS_TEST_HOLDER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(holderEnv); spec != "" {
		if err := runHolder(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if spec := os.Getenv(serverEnv); spec != "" {
		if err := runServer(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runHolder takes n slots of key and renews them every TTL ÷ 3, as a
// request's holder does, printing "held END" after each round, END the
// earliest of the leases' ends (ms on the store's clock), until it is
// killed.
func runHolder(spec string) error {
	f := strings.Fields(spec)
	if len(f) != 5 {
		return fmt.Errorf("holder spec %q", spec)
	}
	n, _ := strconv.Atoi(f[3])
	ttlMS, _ := strconv.Atoi(f[4])
	ttl := time.Duration(ttlMS) * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: f[0]})
	c := redisstore.NewConcurrency(rdb, f[1])
	ctx := context.Background()
	var held []slots.Slot
	earliest := int64(1 << 62)
	for range n {
		s := slots.Slot{Key: f[2], Scope: "reports", Member: slots.NewMember()}
		g, err := c.Acquire(ctx, s, int64(n), int64(n), ttl)
		if err != nil || !g.Admitted {
			return fmt.Errorf("holder acquire: %+v, %v", g, err)
		}
		held = append(held, s)
		earliest = min(earliest, g.ExpiresAt.UnixMilli())
	}
	fmt.Printf("held %d\n", earliest)
	for {
		time.Sleep(slots.RenewInterval(ttl))
		earliest = 1 << 62
		for _, s := range held {
			end, err := c.Renew(ctx, s, ttl)
			if err != nil {
				return fmt.Errorf("holder renew: %w", err)
			}
			earliest = min(earliest, end.UnixMilli())
		}
		fmt.Printf("held %d\n", earliest)
	}
}

// TestKilledHolderSlotsComeBack: a process holding every slot of a key and
// renewing them is SIGKILLed at a point its renewals choose. While any of
// its leases has not ended (on the store's clock), no slot is given to
// anyone else; after they end, every slot comes back, with no release and
// nothing sweeping. Every admission's store time is at or past the
// earliest lease end the holder reported: a slot never comes back early.
func TestKilledHolderSlotsComeBack(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	c := redisstore.NewConcurrency(rdb, "kill")
	const n = 4
	ttl := time.Second
	for round := range 3 {
		key := fmt.Sprintf("acct-%d", round)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s kill %s %d %d", holderEnv, r.Addr(), key, n, ttl.Milliseconds()))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		var reported int64
		// Kill after 1 + round renewal rounds: at a different point of
		// the renew cycle each time.
		for i := 0; i <= round+1 && lines.Scan(); i++ {
			if _, err := fmt.Sscanf(lines.Text(), "held %d", &reported); err != nil {
				t.Fatalf("holder said %q", lines.Text())
			}
		}
		if reported == 0 {
			t.Fatal("the holder never held its slots")
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		killed := storeTimeMS(t, rdb)

		deadline := time.Now().Add(time.Minute)
		var firstOK int64
		for firstOK == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the killed holder's slots never came back", round)
			}
			g, err := c.Acquire(context.Background(), slots.Slot{Key: key, Scope: "reports", Member: slots.NewMember()}, n, n, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if g.Admitted {
				firstOK = g.Now.UnixMilli()
				break
			}
			if g.Held != n {
				t.Fatalf("round %d: %d slots held while refusing, want %d", round, g.Held, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if firstOK < reported {
			t.Fatalf("round %d: a slot came back at %d, before the lease's end %d", round, firstOK, reported)
		}
		// The other leases were renewed moments apart: each comes back at
		// its own end, never before the earliest one reported.
		for i := 1; i < n; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: slot %d of the killed holder never came back", round, i)
			}
			g, err := c.Acquire(context.Background(), slots.Slot{Key: key, Scope: "reports", Member: slots.NewMember()}, n, n, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if !g.Admitted {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if g.Now.UnixMilli() < reported {
				t.Fatalf("round %d: slot %d came back at %d, before the lease's end %d", round, i, g.Now.UnixMilli(), reported)
			}
			i++
		}
		t.Logf("round %d: back %d ms after the kill, %d ms after the last reported lease end (TTL %v, renew every %v)",
			round, firstOK-killed, firstOK-reported, ttl, slots.RenewInterval(ttl))
	}
}

func storeTimeMS(t *testing.T, rdb redis.Cmdable) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}
