package redislog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// childEnv selects the child mode of this test binary: it dials Redis on a
// closed port, so go-redis's connection pool logs "failed to dial", and
// writes its stderr as a binary would.
const childEnv = "REDISLOG_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "slog":
		log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
		Use(log) // what each binary's main does
		log.Info("child started")
		dialClosedPort()
	case "default":
		// go-redis's own logger, untouched: the control.
		dialClosedPort()
	}
	os.Exit(0)
}

// closedAddr is a loopback address nothing listens on: a port that was just
// free, released again.
func closedAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen for a free port: %w", err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr, nil
}

func dialClosedPort() {
	addr, err := closedAddr()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err == nil {
		fmt.Fprintf(os.Stderr, "ping of %s succeeded; it was meant to be closed\n", addr)
		os.Exit(1)
	}
}

// runChild runs this test binary in child mode and returns its stderr lines.
func runChild(t *testing.T, mode string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child (%s): %v; stderr:\n%s", mode, err, stderr.String())
	}
	var lines []string
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// TestGoRedisLinesAreJSON: a process that calls Use writes go-redis's dial
// failure as a JSON object on stderr, like every other line, and writes no
// plain line. The control (go-redis's default logger) shows the plain
// "redis: ... pool.go:..." line the contract forbids, so the test would
// fail without Use.
func TestGoRedisLinesAreJSON(t *testing.T) {
	control := runChild(t, "default")
	plain := false
	for _, line := range control {
		if strings.HasPrefix(line, "redis: ") && !json.Valid([]byte(line)) {
			plain = true
		}
	}
	if !plain {
		t.Fatalf("control: go-redis's default logger wrote no plain 'redis: ' line for a failed dial; the test would prove nothing: %q", control)
	}

	lines := runChild(t, "slog")
	fromRedis := 0
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("stderr line is not JSON (%v): %s", err, line)
		}
		if rec["component"] != "go-redis" {
			continue
		}
		fromRedis++
		msg, _ := rec["msg"].(string)
		if rec["level"] != "WARN" || !strings.Contains(msg, "failed to dial") || strings.HasPrefix(msg, "redis: ") {
			t.Fatalf("go-redis record: %v", rec)
		}
	}
	if fromRedis == 0 {
		t.Fatalf("no go-redis record on stderr: %q", lines)
	}
}

// TestBudget: past the burst, lines are counted instead of written, one
// line per interval gets through, and it says how many were suppressed.
func TestBudget(t *testing.T) {
	var buf safeBuffer
	l := New(slog.New(slog.NewJSONHandler(&buf, nil)), 3, time.Second)
	now := time.Unix(1_800_000_000, 0)
	l.now = func() time.Time { return now }
	ctx := context.Background()
	for i := range 10 {
		l.Printf(ctx, "redis: line %d", i)
	}
	now = now.Add(time.Second)
	l.Printf(ctx, "after a second")

	recs := buf.records(t)
	if len(recs) != 4 {
		t.Fatalf("%d lines written, want the burst of 3 and one after a second: %v", len(recs), recs)
	}
	for i, r := range recs[:3] {
		if r["msg"] != fmt.Sprintf("line %d", i) || r["suppressed"] != nil {
			t.Fatalf("line %d: %v", i, r)
		}
	}
	if r := recs[3]; r["msg"] != "after a second" || r["suppressed"] != float64(7) {
		t.Fatalf("line after the interval: %v, want suppressed 7", r)
	}
}

type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not JSON (%v): %s", err, line)
		}
		out = append(out, rec)
	}
	return out
}
