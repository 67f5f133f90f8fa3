package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a real Redis Cluster of masters only, on loopback.
type Cluster struct {
	Masters []*Redis
	secure  *Secure // nil = plain text, no ACL (StartSecureCluster sets it)
}

// cli is redis-cli with args against the node on port (over TLS, as the
// ACL user, when the cluster is secured).
func (c *Cluster) cli(ctx context.Context, port int, args ...string) *exec.Cmd {
	full := []string{"-p", strconv.Itoa(port)}
	if c.secure != nil {
		full = append(full, c.secure.cliArgs()...)
	}
	return exec.CommandContext(ctx, "redis-cli", append(full, args...)...)
}

// Addrs are host:port of every master, for REDIS_ADDRS or redis.ClusterOptions.Addrs.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		out[i] = m.Addr()
	}
	return out
}

// Close stops every master. Safe to call more than once.
func (c *Cluster) Close() {
	for _, m := range c.Masters {
		m.Close()
	}
}

// StartCluster starts masters redis-server processes with cluster mode on,
// joins them with `redis-cli --cluster create` (no replicas; the slots are
// spread evenly) and waits until every node reports cluster_state:ok. The
// cluster keeps serving the slots of live masters when one dies
// (cluster-require-full-coverage no), which is what a test of "losing one
// master degrades only its keys" needs. Stopped at cleanup.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	SkipShort(tb)
	c, err := NewCluster(tb.TempDir(), masters)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// NewCluster is StartCluster for TestMain and tools; the caller must Close it.
func NewCluster(dir string, masters int) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	c := &Cluster{}
	if err := c.startMasters(dir, masters, clusterNodeArgs, nil); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.create(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// ClusterPorts picks n loopback ports, each free together with its cluster
// bus port, for a cluster to be started later on exactly these ports
// (NewClusterAt): a test of a client that starts before its cluster.
func ClusterPorts(n int) ([]int, error) {
	used := map[int]bool{}
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := clusterPort(used)
		if err != nil {
			return nil, err
		}
		used[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// NewClusterAt starts a cluster whose masters listen on ports (from
// ClusterPorts); the caller must Close it.
func NewClusterAt(dir string, ports []int) (*Cluster, error) {
	if len(ports) < 3 {
		return nil, fmt.Errorf("a Redis Cluster needs at least 3 masters, got %d", len(ports))
	}
	c := &Cluster{}
	for _, port := range ports {
		r := &Redis{Port: port, dir: dir, args: clusterNodeArgs(port)}
		if err := r.start(); err != nil {
			c.Close()
			return nil, fmt.Errorf("start cluster master on port %d: %w", port, err)
		}
		c.Masters = append(c.Masters, r)
	}
	if err := c.create(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// create joins the masters into one cluster and waits until it is ok.
// redis-cli waits for the nodes to meet over the cluster bus (TLS
// handshakes too, for a secure cluster); on a machine loaded far past its
// cores that took longer than a minute, so the bound is generous.
func (c *Cluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout(3*time.Minute))
	defer cancel()
	var args []string
	if c.secure != nil {
		args = c.secure.cliArgs()
	}
	args = append(append(args, "--cluster", "create"), c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	return c.WaitOK(ctx, nil)
}

// clusterNodeArgs are the redis-server arguments of a cluster master on port.
func clusterNodeArgs(port int) []string {
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port),
		"--cluster-node-timeout", "1000",
		"--cluster-require-full-coverage", "no",
	}
}

// startMasters starts n masters in dir, each on a port free together with
// its bus port (a port taken meanwhile is tried again elsewhere), with the
// arguments args gives for its port; secure, when set, is how they are
// reached. They are appended to c.Masters as they start.
func (c *Cluster) startMasters(dir string, n int, args func(port int) []string, secure *Secure) error {
	used := map[int]bool{}
	for i := 0; i < n; i++ {
		var r *Redis
		var lastErr error
		for attempt := 0; attempt < 20 && r == nil; attempt++ {
			port, err := clusterPort(used)
			if err != nil {
				lastErr = err
				continue
			}
			used[port] = true
			cand := &Redis{Port: port, dir: dir, args: args(port), secure: secure}
			if lastErr = cand.start(); lastErr == nil {
				r = cand
			}
		}
		if r == nil {
			return fmt.Errorf("start cluster master %d: %w", i, lastErr)
		}
		c.Masters = append(c.Masters, r)
	}
	return nil
}

// clusterPort picks a loopback port that is free together with its cluster
// bus port (port + 10000).
func clusterPort(used map[int]bool) (int, error) { return pickPort(used, 10000) }

// WaitOK waits until every live master except those in skip reports
// cluster_state:ok with all 16384 slots assigned and knows every other
// master (when one was killed, until the others have marked it failed).
func (c *Cluster) WaitOK(ctx context.Context, skip map[int]bool) error {
	var last string
	for {
		ok := true
		for i, m := range c.Masters {
			if skip[i] || m.proc == nil || m.proc.Exited() {
				continue
			}
			out, err := c.cli(ctx, m.Port, "cluster", "info").Output()
			s := string(out)
			if err != nil || !strings.Contains(s, "cluster_state:ok") || !strings.Contains(s, "cluster_slots_assigned:16384") ||
				!strings.Contains(s, "cluster_known_nodes:"+strconv.Itoa(len(c.Masters))) {
				ok, last = false, fmt.Sprintf("node %d: %v %s", m.Port, err, s)
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ok: %w; last: %s", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KillMaster kills master i (SIGKILL) and waits until the other masters
// have marked it failed, so they keep serving their own slots.
func (c *Cluster) KillMaster(tb testing.TB, i int) {
	tb.Helper()
	c.Masters[i].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead := fmt.Sprintf("127.0.0.1:%d", c.Masters[i].Port)
	for j, m := range c.Masters {
		if j == i {
			continue
		}
		for {
			out, _ := c.cli(ctx, m.Port, "cluster", "nodes").Output()
			failed := false
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, dead) && strings.Contains(line, "fail") && !strings.Contains(line, "fail?") {
					failed = true
				}
			}
			if failed {
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("master %s was not marked failed by %d: %s", dead, m.Port, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
