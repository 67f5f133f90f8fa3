package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClickHouse is a clickhouse-server child process with its own data
// directory, on free loopback ports (native TCP and HTTP).
type ClickHouse struct {
	TCPPort  int
	HTTPPort int
	// InterserverPort is the replication (interserver HTTP) port; 0 when
	// the server has none (a single node: no replicated tables).
	InterserverPort int
	Dir             string // holds config.xml, data/, tmp/ and the logs
	proc            *Process

	cacheBytes int    // mark and uncompressed cache sizes
	extra      string // XML inside <yandex>, after the common settings
	usersXML   string // users.xml written to Dir; "" = the system's

	// short: MainWithClickHouse in -short mode started no server; the
	// methods that take a test skip it.
	short bool
}

// ClickHouseOption changes how NewClickHouse configures a server.
type ClickHouseOption func(*ClickHouse)

// WithCacheBytes sets mark_cache_size and uncompressed_cache_size (default
// 256 MiB each): servers started several at a time keep them small.
func WithCacheBytes(n int) ClickHouseOption { return func(c *ClickHouse) { c.cacheBytes = n } }

// WithConfigXML adds elements to the server's config.xml (inside <yandex>).
// The placeholders {{TCP}}, {{HTTP}}, {{INTERSERVER}} and {{DIR}} are
// replaced by the server's own values.
func WithConfigXML(xml string) ClickHouseOption { return func(c *ClickHouse) { c.extra += xml } }

// WithUsersXML replaces the system's users.xml with xml (written to the
// server's directory): users, passwords, profiles and quotas of its own.
func WithUsersXML(xml string) ClickHouseOption { return func(c *ClickHouse) { c.usersXML = xml } }

// WithPorts fixes the server's ports instead of picking free ones (a
// cluster's configs name every member's ports before any of them starts).
// interserver may be 0 (no replication port).
func WithPorts(tcp, http, interserver int) ClickHouseOption {
	return func(c *ClickHouse) { c.TCPPort, c.HTTPPort, c.InterserverPort = tcp, http, interserver }
}

// Addr is host:port of the native protocol (what clickhouse-go dials).
func (c *ClickHouse) Addr() string { return fmt.Sprintf("127.0.0.1:%d", c.TCPPort) }

// Process is the running server (for Kill, Signal(SIGSTOP), ...); nil while stopped.
func (c *ClickHouse) Process() *Process { return c.proc }

// StartClickHouse starts a clickhouse-server for the test and stops it at cleanup.
func StartClickHouse(tb testing.TB) *ClickHouse {
	tb.Helper()
	SkipShort(tb)
	c, err := NewClickHouse(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// NewClickHouse starts a clickhouse-server with its files under dir. The
// caller must Close it. It is for TestMain, benchmarks and tools; tests use
// StartClickHouse.
func NewClickHouse(dir string, opts ...ClickHouseOption) (*ClickHouse, error) {
	fixed := &ClickHouse{Dir: dir, cacheBytes: 256 << 20}
	for _, o := range opts {
		o(fixed)
	}
	if fixed.TCPPort != 0 {
		if err := fixed.Start(); err != nil {
			return nil, fmt.Errorf("start clickhouse-server: %w", err)
		}
		return fixed, nil
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		tcp, err := freePort()
		if err != nil {
			return nil, err
		}
		httpPort, err := freePort()
		if err != nil {
			return nil, err
		}
		if httpPort == tcp {
			continue
		}
		c := *fixed
		c.TCPPort, c.HTTPPort = tcp, httpPort
		if err := c.Start(); err != nil {
			lastErr = err
			continue
		}
		return &c, nil
	}
	return nil, fmt.Errorf("start clickhouse-server: %w", lastErr)
}

const clickhouseConfig = `<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>{{DIR}}/server.log</log>
        <errorlog>{{DIR}}/error.log</errorlog>
        <size>100M</size>
        <count>1</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>{{TCP}}</tcp_port>
    <http_port>{{HTTP}}</http_port>
    <path>{{DIR}}/data/</path>
    <tmp_path>{{DIR}}/tmp/</tmp_path>
    <user_files_path>{{DIR}}/user_files/</user_files_path>
    <format_schema_path>{{DIR}}/format_schemas/</format_schema_path>
    <users_config>{{USERS}}</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <max_connections>256</max_connections>
    <max_concurrent_queries>100</max_concurrent_queries>
    <mark_cache_size>{{CACHE}}</mark_cache_size>
    <uncompressed_cache_size>{{CACHE}}</uncompressed_cache_size>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
{{EXTRA}}</yandex>
`

// Start starts the server (again) on its ports with its data directory and
// waits until it answers queries. Data written before a Stop is still there.
func (c *ClickHouse) Start() error {
	if c.proc != nil && !c.proc.Exited() {
		return fmt.Errorf("clickhouse-server on %d is already running", c.TCPPort)
	}
	for _, d := range []string{"data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return fmt.Errorf("clickhouse dir: %w", err)
		}
	}
	if c.cacheBytes == 0 {
		c.cacheBytes = 256 << 20
	}
	users := "/etc/clickhouse-server/users.xml"
	if c.usersXML != "" {
		users = filepath.Join(c.Dir, "users.xml")
		if err := os.WriteFile(users, []byte(c.usersXML), 0o600); err != nil {
			return fmt.Errorf("clickhouse users: %w", err)
		}
	}
	cfg := strings.Replace(clickhouseConfig, "{{EXTRA}}", c.extra, 1)
	cfg = strings.Replace(cfg, "{{USERS}}", users, 1)
	cfg = strings.NewReplacer("{{DIR}}", c.Dir, "{{TCP}}", fmt.Sprint(c.TCPPort), "{{HTTP}}", fmt.Sprint(c.HTTPPort),
		"{{INTERSERVER}}", fmt.Sprint(c.InterserverPort), "{{CACHE}}", fmt.Sprint(c.cacheBytes)).Replace(cfg)
	cfgPath := filepath.Join(c.Dir, "config.xml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("clickhouse config: %w", err)
	}
	logPath := filepath.Join(c.Dir, "stdout.log")
	p, err := startProcess("clickhouse", logPath, "clickhouse-server", "--config-file="+cfgPath)
	if err != nil {
		return err
	}
	if err := c.waitReady(p, 60*time.Second); err != nil {
		p.Kill()
		out, _ := os.ReadFile(logPath)
		errLog, _ := os.ReadFile(filepath.Join(c.Dir, "error.log"))
		return fmt.Errorf("clickhouse-server on %d: %w; stdout: %s; error.log tail: %s", c.TCPPort, err, tail(out), tail(errLog))
	}
	c.proc = p
	return nil
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// waitReady polls the HTTP /ping endpoint, then the native port.
func (c *ClickHouse) waitReady(p *Process, within time.Duration) error {
	deadline := time.Now().Add(Timeout(within))
	// No idle keep-alive connection left behind: clickhouse-server waits
	// for open connections when it is stopped.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	url := fmt.Sprintf("http://127.0.0.1:%d/ping", c.HTTPPort)
	for {
		if p.Exited() {
			return fmt.Errorf("exited during start: %v", p.err)
		}
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.HasPrefix(string(body), "Ok") {
				return waitTCP(c.Addr(), time.Until(deadline))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the server with SIGTERM (killing it after 20 s); Start brings it
// back with the same data.
func (c *ClickHouse) Stop() {
	if c.proc != nil && !c.proc.Exited() {
		c.proc.Stop(20 * time.Second)
	}
}

// Close stops the server. Safe to call more than once.
func (c *ClickHouse) Close() { c.Stop() }

var dbSeq atomic.Int64

func (c *ClickHouse) skipShort(tb testing.TB) {
	tb.Helper()
	if c.short {
		SkipShort(tb)
	}
}

// Conn opens a native-protocol connection to the server (database
// "default"), closed at cleanup.
func (c *ClickHouse) Conn(tb testing.TB) driver.Conn {
	tb.Helper()
	c.skipShort(tb)
	conn, err := c.Open()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// Open opens a native-protocol connection to the server (database
// "default"). The caller closes it.
func (c *ClickHouse) Open() (driver.Conn, error) {
	if c.short {
		return nil, errors.New("clickhouse: no server in -short mode")
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:         []string{c.Addr()},
		Auth:         clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout:  5 * time.Second,
		ReadTimeout:  30 * time.Second,
		MaxOpenConns: 8,
	})
	if err != nil {
		return nil, fmt.Errorf("clickhouse open %s: %w", c.Addr(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("clickhouse ping %s: %w", c.Addr(), err)
	}
	return conn, nil
}

// Database returns a fresh database name for one test (not created: the
// code under test creates it) and drops it at cleanup.
func (c *ClickHouse) Database(tb testing.TB) string {
	tb.Helper()
	c.skipShort(tb)
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	tb.Cleanup(func() {
		conn, err := c.Open()
		if err != nil {
			return // the server may be stopped by the test; the data dir goes with TempDir
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name)
	})
	return name
}

// MainWithClickHouse is a package's TestMain body when its tests share one
// clickhouse-server: it starts the server (its data in a fresh temporary
// directory), stores it in *ch, runs the tests, stops the server and
// returns the exit code for os.Exit. A server that cannot start fails the
// run; it is never skipped. In -short mode it starts none, and the tests
// that ask *ch for a connection or a database are skipped.
func MainWithClickHouse(m *testing.M, ch **ClickHouse) int {
	if Short() {
		*ch = &ClickHouse{short: true}
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "testenv-ch-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	c, err := NewClickHouse(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start clickhouse-server:", err)
		return 1
	}
	defer c.Close()
	*ch = c
	return m.Run()
}
