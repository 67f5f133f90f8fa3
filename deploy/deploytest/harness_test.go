package deploytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/repo"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// binaries are the commands under cmd/ that the deployment files run.
var binaries = []string{"limiter", "meter-consumer", "usage-api", "kafka-dev", "demo-traffic"}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// buildBinaries builds the commands the deployment runs (binaries) once per test binary, with
// CGO_ENABLED=0 (as the Dockerfile does), into a directory removed when the
// tests end, and returns the directory.
func buildBinaries(tb testing.TB) string {
	tb.Helper()
	testenv.SkipShort(tb)
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "deploytest-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		args := []string{"build", "-o", dir + string(filepath.Separator)}
		for _, b := range binaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.CommandContext(ctx, repo.GoTool(tb), args...)
		cmd.Dir = repo.Root(tb)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("CGO_ENABLED=0 go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return buildDir
}

// The slow tests of this package (a stack of binaries, make up, promtool,
// the scans of every file) run in parallel (t.Parallel): each has its own
// free ports and directories, and one after another they were the longest
// package of make test.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// proc is a binary started by a test; stopped (SIGTERM, then SIGKILL) at cleanup.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
	mu   *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func startBinary(tb testing.TB, binDir, name string, env ...string) *proc {
	tb.Helper()
	cmd := exec.Command(filepath.Join(binDir, name))
	cmd.Dir = repo.Root(tb)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: &bytes.Buffer{}, mu: &sync.Mutex{}}
	cmd.Stdout = lockedWriter{p.mu, p.log}
	cmd.Stderr = lockedWriter{p.mu, p.log}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(testenv.Timeout(12 * time.Second)):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if tb.Failed() {
			tb.Logf("--- %s log ---\n%s", name, p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func freeAddr(tb testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb))
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// waitStatus polls url until it answers want, or fails the test after within.
func waitStatus(tb testing.TB, p *proc, url string, want int, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(testenv.Timeout(within))
	var last string
	for {
		if p != nil && p.exited() {
			tb.Fatalf("%s exited while waiting for %s:\n%s", p.name, url, p.output())
		}
		resp, err := httpClient.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
			last = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not answer %d within %s; last: %s", url, want, within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// do sends one request and returns status, headers and body.
func do(tb testing.TB, method, url, token string, body []byte) (int, http.Header, []byte) {
	tb.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		tb.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, out
}
