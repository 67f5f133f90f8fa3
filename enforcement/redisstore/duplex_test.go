package redisstore_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// exactPerCaller drives p with callers goroutines, each on a key of its
// own with a burst and a cost of its own and a rate that refills nothing
// while the test runs, and checks that every verdict is its caller's: the
// j-th decision of caller i leaves exactly burst_i − cost_i·j tokens. A
// reply handed to the wrong caller (out of order on a connection, or one
// left over from a closed connection) shows as another key's count. The
// callers' deadline is a minute away, and a script call waits for the
// latest of its callers' (PipelineConfig.Timeout): a starved machine
// makes the test slower, never wrong.
func exactPerCaller(t *testing.T, p enforcement.Authority, prefix string, callers, each int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%s-%d", prefix, i)
			burst, cost := int64(10000+37*i), int64(1+i%5)
			lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: burst}
			for j := range each {
				v, err := p.Take(ctx, key, "s", lim, cost)
				if err != nil {
					t.Errorf("%s, decision %d: %v", key, j, err)
					return
				}
				if want := burst - cost*int64(j+1); !v.Allowed || v.Remaining != want {
					t.Errorf("%s, decision %d: %+v, want allowed with %d remaining", key, j, v, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestDuplexVerdictsReachTheirCallers: many callers at once on one
// connection (one server) and on one connection per master (a Cluster of
// three) each get their own verdicts, in their own order.
func TestDuplexVerdictsReachTheirCallers(t *testing.T) {
	t.Run("one server", func(t *testing.T) {
		r := testenv.StartRedis(t)
		exactPerCaller(t, newPipelined(t, newClient(t, r.Addr()), "dorder"), "k", 64, 50)
	})
	t.Run("cluster", func(t *testing.T) {
		cl := testenv.StartCluster(t, 3)
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
		defer rdb.Close()
		exactPerCaller(t, newPipelined(t, rdb, "dorder"), "k", 64, 20)
	})
}

// TestPipelinedClusterContract: the authority contract over a Cluster.
func TestPipelinedClusterContract(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	authoritytest.Run(t, newPipelined(t, rdb, "pclcontract"))
}

// TestDuplexPausedConnectionIsReplaced: while redis-server is stopped
// (SIGSTOP: the connection stays open and nothing comes back), a caller
// whose own deadline passes is released with its own error, and one with
// no deadline of its own is answered when the pipeline's deadline passes:
// the stalled connection is closed, with every call still on it failed.
// After SIGCONT the store answers again on a new connection, and the
// replies Redis still owed on the old one (it may run the calls it had
// read) reach nobody: every later verdict is its own caller's.
//
// Nothing here is timed: the released callers are waited for as long as
// it takes (bounded at a minute to end a broken run).
func TestDuplexPausedConnectionIsReplaced(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	ctx := context.Background()
	if err := redisstore.New(c, "dpause").Preload(ctx); err != nil {
		t.Fatal(err)
	}
	p := redisstore.NewPipelined(c, "dpause", redisstore.PipelineConfig{Timeout: 200 * time.Millisecond})
	running(t, p)
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 100}
	warm, cancelWarm := context.WithTimeout(ctx, time.Minute)
	defer cancelWarm()
	if _, err := p.Take(warm, "warm", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = r.Process().Signal(syscall.SIGCONT)
		}
	}()

	within := func(what string, f func() error) error {
		t.Helper()
		res := make(chan error, 1)
		go func() { res <- f() }()
		select {
		case err := <-res:
			return err
		case <-time.After(testenv.Timeout(time.Minute)):
			t.Fatalf("%s: not answered within a minute", what)
			return nil
		}
	}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := within("a caller with its own deadline", func() error {
				cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				_, err := p.Take(cctx, fmt.Sprint("gone", i), "s", lim, 1)
				return err
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("caller %d, its deadline passed: %v, want its own context error", i, err)
			}
		}()
	}
	err := within("a caller with no deadline", func() error {
		_, err := p.Take(ctx, "nodeadline", "s", lim, 1)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "connection closed") {
		t.Errorf("a caller with no deadline, the store paused: %v, want the stalled connection's failure", err)
	}
	wg.Wait()

	resumed = true
	if err := r.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The new connection may still be dialling: wait for a first answer.
	long, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i := 0; ; i++ {
		_, err := p.Take(long, fmt.Sprint("probe", i), "s", lim, 1)
		if err == nil {
			break
		}
		if i > 1000 {
			t.Fatalf("not answering after SIGCONT: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	exactPerCaller(t, p, "after", 32, 20)
}

// TestDuplexOverTLSWithACL: the pipelined connection is dialled as the
// go-redis client is configured: TLS with a client certificate, an ACL
// user and its password (AUTH), a database (SELECT) and a client name.
func TestDuplexOverTLSWithACL(t *testing.T) {
	certs := testenv.NewCerts(t)
	r := testenv.StartSecureRedis(t, testenv.Secure{Certs: certs, User: "duplex", Password: "duplex-secret", KeyPattern: "dtls:*", ClientCerts: true})
	c := redis.NewClient(&redis.Options{
		Addr: r.Addr(), TLSConfig: clientTLS(t, certs), Username: "duplex", Password: "duplex-secret",
		DB: 3, ClientName: "duplex-test", ContextTimeoutEnabled: true,
	})
	defer c.Close()
	exactPerCaller(t, newPipelined(t, c, "dtls"), "k", 8, 10)
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "name=duplex-test") || !strings.Contains(list, "db=3") {
		t.Errorf("CLIENT LIST shows no connection named duplex-test on db 3:\n%s", list)
	}
	n, err := c.Exists(context.Background(), "dtls:{k-0}:b2:s").Result()
	if err != nil || n != 1 {
		t.Errorf("the bucket is not in db 3: %d %v", n, err)
	}
}

// clientTLS trusts the test CA and presents the client certificate.
func clientTLS(t *testing.T, certs *testenv.Certs) *tls.Config {
	t.Helper()
	ca, err := os.ReadFile(certs.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "localhost"}
}

// TestDuplexReadOnlyRedials: a server demoted to a replica under a live
// connection (a Sentinel failover) refuses the decision with READONLY,
// and the connection is dialled again (under Sentinel the dialer then
// finds the new master): a new client id once the server is a master again.
func TestDuplexReadOnlyRedials(t *testing.T) {
	r, other := testenv.StartRedis(t), testenv.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), ClientName: "duplex-ro", ContextTimeoutEnabled: true})
	defer c.Close()
	if err := redisstore.New(c, "dro").Preload(ctx); err != nil {
		t.Fatal(err)
	}
	p := newPipelined(t, c, "dro")
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 100}
	if _, err := p.Take(ctx, "k", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	before := duplexClientID(t, c)
	if err := c.Do(ctx, "REPLICAOF", "127.0.0.1", fmt.Sprint(other.Port)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Take(ctx, "k", "s", lim, 1); err == nil || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("a decision on a replica: %v, want READONLY", err)
	}
	if err := c.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if _, err := p.Take(ctx, "k2", "s", lim, 1); err == nil {
			break
		} else if i > 1000 {
			t.Fatalf("not answering as a master again: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after := duplexClientID(t, c); after == before {
		t.Fatalf("the pipelined connection is still client %s after READONLY", before)
	}
}

// duplexClientID is the id of the one connection named duplex-ro (the
// pipelined store's; go-redis's own are named alike but there are none
// open to count: the test sends nothing else through c but CLIENT LIST).
func duplexClientID(t *testing.T, c *redis.Client) string {
	t.Helper()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "name=duplex-ro") && !strings.Contains(line, "cmd=client|list") {
			f := strings.Fields(line)
			ids = append(ids, strings.TrimPrefix(f[0], "id="))
		}
	}
	if len(ids) != 1 {
		t.Fatalf("%d connections named duplex-ro besides CLIENT LIST's: %v\n%s", len(ids), ids, list)
	}
	return ids[0]
}
