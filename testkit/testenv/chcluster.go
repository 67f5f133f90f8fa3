package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClusterName is the cluster's name in every node's remote_servers (what
// the schema's Distributed tables and CLICKHOUSE_CLUSTER name).
const ClusterName = "ratewarden"

// clusterCacheBytes keeps four servers on a shared machine small: the
// tests' tables are megabytes.
const clusterCacheBytes = 32 << 20

// ClickHouseCluster is ZooKeeper and clickhouse-server processes forming
// one cluster of Shards[i][j] (shard i, replica j): remote_servers with
// internal_replication (a Distributed table writes one replica and the
// replicated tables copy it), macros {shard} and {replica} for the
// ReplicatedMergeTree paths, and the ZooKeeper that coordinates them.
type ClickHouseCluster struct {
	Name      string
	ZooKeeper *ZooKeeper
	Shards    [][]*ClickHouse
}

// Nodes is every server, shard by shard.
func (c *ClickHouseCluster) Nodes() []*ClickHouse {
	var out []*ClickHouse
	for _, s := range c.Shards {
		out = append(out, s...)
	}
	return out
}

// ShardAddrs is the native address of every replica, per shard: what
// CLICKHOUSE_SHARDS lists.
func (c *ClickHouseCluster) ShardAddrs() [][]string {
	out := make([][]string, len(c.Shards))
	for i, s := range c.Shards {
		for _, n := range s {
			out[i] = append(out[i], n.Addr())
		}
	}
	return out
}

// ShardsEnv is ShardAddrs in the CLICKHOUSE_SHARDS form: replicas
// separated by ",", shards by ";".
func (c *ClickHouseCluster) ShardsEnv() string {
	var shards []string
	for _, s := range c.ShardAddrs() {
		shards = append(shards, strings.Join(s, ","))
	}
	return strings.Join(shards, ";")
}

// Close stops every server. Safe to call more than once.
func (c *ClickHouseCluster) Close() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes() {
		wg.Add(1)
		go func() { defer wg.Done(); n.Close() }()
	}
	wg.Wait()
	if c.ZooKeeper != nil {
		c.ZooKeeper.Close()
	}
}

// NewClickHouseCluster starts ZooKeeper and shards × replicas
// clickhouse-servers with their files under dir. The caller must Close it.
func NewClickHouseCluster(dir string, shards, replicas int) (*ClickHouseCluster, error) {
	zk, err := NewZooKeeper(filepath.Join(dir, "zookeeper"))
	if err != nil {
		return nil, err
	}
	c := &ClickHouseCluster{Name: ClusterName, ZooKeeper: zk}
	type ports struct{ tcp, http, inter int }
	all := make([][]ports, shards)
	seen := map[int]bool{}
	pick := func() (int, error) {
		for {
			p, err := freePort()
			if err != nil {
				return 0, err
			}
			if !seen[p] {
				seen[p] = true
				return p, nil
			}
		}
	}
	for i := range all {
		all[i] = make([]ports, replicas)
		for j := range all[i] {
			for _, p := range []*int{&all[i][j].tcp, &all[i][j].http, &all[i][j].inter} {
				if *p, err = pick(); err != nil {
					zk.Close()
					return nil, err
				}
			}
		}
	}
	var remote strings.Builder
	fmt.Fprintf(&remote, "    <remote_servers>\n        <%s>\n", ClusterName)
	for _, s := range all {
		remote.WriteString("            <shard>\n                <internal_replication>true</internal_replication>\n")
		for _, r := range s {
			fmt.Fprintf(&remote, "                <replica><host>127.0.0.1</host><port>%d</port></replica>\n", r.tcp)
		}
		remote.WriteString("            </shard>\n")
	}
	fmt.Fprintf(&remote, "        </%s>\n    </remote_servers>\n", ClusterName)
	// session_timeout_ms: a loaded machine must not expire sessions (a
	// replica whose session expired turns read-only until it reconnects).
	zkXML := fmt.Sprintf(`    <zookeeper>
        <node><host>127.0.0.1</host><port>%d</port></node>
        <session_timeout_ms>30000</session_timeout_ms>
        <operation_timeout_ms>10000</operation_timeout_ms>
    </zookeeper>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
`, zk.Port)

	type result struct {
		i, j int
		n    *ClickHouse
		err  error
	}
	results := make(chan result)
	c.Shards = make([][]*ClickHouse, shards)
	for i := range all {
		c.Shards[i] = make([]*ClickHouse, replicas)
		for j, p := range all[i] {
			macros := fmt.Sprintf("    <macros><shard>%02d</shard><replica>s%dr%d</replica></macros>\n", i+1, i+1, j+1)
			node := fmt.Sprintf("    <interserver_http_port>{{INTERSERVER}}</interserver_http_port>\n    <interserver_http_host>127.0.0.1</interserver_http_host>\n")
			go func() {
				n, err := NewClickHouse(filepath.Join(dir, fmt.Sprintf("s%dr%d", i+1, j+1)),
					WithPorts(p.tcp, p.http, p.inter), WithCacheBytes(clusterCacheBytes),
					WithConfigXML(node+remote.String()+zkXML+macros))
				results <- result{i, j, n, err}
			}()
		}
	}
	var errs []string
	for k := 0; k < shards*replicas; k++ {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err.Error())
			continue
		}
		c.Shards[r.i][r.j] = r.n
	}
	if len(errs) > 0 {
		for _, s := range c.Shards {
			for _, n := range s {
				if n != nil {
					n.Close()
				}
			}
		}
		zk.Close()
		return nil, fmt.Errorf("clickhouse cluster: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// StartClickHouseCluster starts a cluster for one test and stops it at
// cleanup. Most tests share one per package (SharedClickHouseCluster).
func StartClickHouseCluster(tb testing.TB, shards, replicas int) *ClickHouseCluster {
	tb.Helper()
	SkipShort(tb)
	c, err := NewClickHouseCluster(tb.TempDir(), shards, replicas)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// SharedClickHouseCluster is a package's 2 shards × 2 replicas cluster,
// started when a test first asks for it (so a run that selects none of
// those tests starts none) and stopped by Close from TestMain after m.Run.
type SharedClickHouseCluster struct {
	once sync.Once
	c    *ClickHouseCluster
	dir  string
	err  error
}

// Get returns the running cluster, starting it on first use. A cluster
// that cannot start fails the test (never a skip).
func (s *SharedClickHouseCluster) Get(tb testing.TB) *ClickHouseCluster {
	tb.Helper()
	SkipShort(tb)
	s.once.Do(func() {
		s.dir, s.err = os.MkdirTemp("", "testenv-chcluster-")
		if s.err != nil {
			return
		}
		s.c, s.err = NewClickHouseCluster(s.dir, 2, 2)
	})
	if s.err != nil {
		tb.Fatalf("clickhouse cluster: %v", s.err)
	}
	return s.c
}

// Close stops the cluster if it was started and removes its files.
func (s *SharedClickHouseCluster) Close() {
	if s.c != nil {
		s.c.Close()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// ShardConns opens one connection to every node, [shard][replica] (what
// schema.ApplyCluster migrates), closed at cleanup.
func (c *ClickHouseCluster) ShardConns(tb testing.TB) [][]driver.Conn {
	tb.Helper()
	out := make([][]driver.Conn, len(c.Shards))
	for i, s := range c.Shards {
		for _, n := range s {
			out[i] = append(out[i], n.Conn(tb))
		}
	}
	return out
}

// Conns opens one connection to every node, shard by shard, closed at
// cleanup.
func (c *ClickHouseCluster) Conns(tb testing.TB) []driver.Conn {
	tb.Helper()
	var out []driver.Conn
	for _, n := range c.Nodes() {
		out = append(out, n.Conn(tb))
	}
	return out
}

// Database returns a fresh database name for one test (not created: the
// code under test creates it on every node) and drops it on every node
// that runs at cleanup (dropping its replicated tables' ZooKeeper nodes).
func (c *ClickHouseCluster) Database(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("c%d_%d", os.Getpid(), dbSeq.Add(1))
	tb.Cleanup(func() {
		for _, n := range c.Nodes() {
			if n.Process() == nil || n.Process().Exited() {
				continue
			}
			conn, err := n.Open()
			if err != nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name)
			cancel()
			conn.Close()
		}
	})
	return name
}
