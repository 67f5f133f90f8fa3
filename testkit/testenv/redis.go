package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Redis is a redis-server started on a free loopback port with no persistence.
type Redis struct {
	Port   int
	dir    string
	args   []string
	proc   *Process
	secure *Secure // nil = plain text, no ACL (StartSecureRedis sets it)
}

// Addr is host:port of the server.
func (r *Redis) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.Port) }

// Process is the running server (for Kill, Signal(SIGSTOP), ...).
func (r *Redis) Process() *Process { return r.proc }

// StartRedis starts a redis-server for the test and stops it at cleanup.
// extra are additional redis-server arguments (e.g. "--cluster-enabled", "yes").
func StartRedis(tb testing.TB, extra ...string) *Redis {
	tb.Helper()
	SkipShort(tb)
	r, err := NewRedis(tb.TempDir(), extra...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// NewRedis starts a redis-server with its files in dir. The caller must Close it.
// It is for TestMain and tools; tests use StartRedis.
func NewRedis(dir string, extra ...string) (*Redis, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		r := &Redis{Port: port, dir: dir, args: extra}
		if err := r.start(); err != nil {
			lastErr = err
			continue
		}
		return r, nil
	}
	return nil, fmt.Errorf("start redis-server: %w", lastErr)
}

// NewRedisAt starts a redis-server on port (from FreePort), for a test of a
// client that starts before its server. The caller must Close it.
func NewRedisAt(dir string, port int, extra ...string) (*Redis, error) {
	r := &Redis{Port: port, dir: dir, args: extra}
	if err := r.start(); err != nil {
		return nil, fmt.Errorf("start redis-server on port %d: %w", port, err)
	}
	return r, nil
}

func (r *Redis) start() error {
	args := []string{
		"--port", strconv.Itoa(r.Port),
		"--bind", "127.0.0.1",
		"--dir", r.dir,
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--loglevel", "warning",
		"--dbfilename", fmt.Sprintf("dump-%d.rdb", r.Port),
	}
	args = append(args, r.args...)
	logPath := filepath.Join(r.dir, fmt.Sprintf("redis-%d.log", r.Port))
	p, err := startProcess("redis", logPath, "redis-server", args...)
	if err != nil {
		return err
	}
	if err := waitTCP(r.Addr(), 10*time.Second); err != nil {
		p.Kill()
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("redis-server on %d: %w; log: %s", r.Port, err, log)
	}
	r.proc = p
	return nil
}

// Restart kills the server and starts a new, empty one on the same port:
// what a failover to a replica that lost its state looks like to a client.
func (r *Redis) Restart() error {
	if r.proc != nil && !r.proc.Exited() {
		r.proc.Kill()
	}
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = r.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	return err
}

// Close stops the server. Safe to call more than once.
func (r *Redis) Close() {
	if r.proc != nil && !r.proc.Exited() {
		r.proc.Kill()
	}
}
