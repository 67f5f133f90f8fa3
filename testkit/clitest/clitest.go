// Package clitest runs a built binary with words and reports how it ended,
// failing the test the moment it listens on an address it was given: the
// strict-argument tests of every binary (internal/cli) share it.
package clitest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// Result is how a run ended.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// exitBound is how long a refusal may take: generous, since a slow or
// loaded machine may take seconds to start a race-built binary; a binary
// that ignored its words and serves is caught by the dial loop well before.
const exitBound = 60 * time.Second

// Run starts bin with args and env (on top of PATH and HOME) and waits for
// it to exit. While it runs, each of addrs is dialled in turn: a connection
// that succeeds means the binary started serving instead of refusing its
// words, and fails the test (the process is killed). After it exits, each
// address must still refuse connections.
func Run(t *testing.T, bin string, env, addrs []string, args ...string) Result {
	t.Helper()
	testenv.SkipShort(t)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(baseEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(exitBound)
	var err error
wait:
	for i := 0; ; i++ {
		select {
		case err = <-done:
			break wait
		case <-deadline:
			cmd.Process.Kill()
			<-done
			t.Fatalf("%s %q did not exit within %s\nstderr: %s", bin, args, exitBound, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if len(addrs) > 0 && listening(addrs[i%len(addrs)]) {
			cmd.Process.Kill()
			<-done
			t.Fatalf("%s %q listens on %s instead of refusing its words\nstderr: %s", bin, args, addrs[i%len(addrs)], stderr.String())
		}
	}
	for _, a := range addrs {
		if listening(a) {
			t.Errorf("%s %q: something listens on %s after it exited", bin, args, a)
		}
	}
	r := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	default:
		t.Fatalf("%s %q: %v", bin, args, err)
	}
	return r
}

// Serves starts bin with no words and env and reports whether addr accepts
// a connection within the bound: the control that shows Run's dial would
// catch a binary that serves. The process is stopped before it returns.
func Serves(t *testing.T, bin string, env []string, addr string) bool {
	t.Helper()
	testenv.SkipShort(t)
	cmd := exec.Command(bin)
	cmd.Env = append(baseEnv(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(exitBound):
			cmd.Process.Kill()
			<-done
		}
	}()
	deadline := time.Now().Add(exitBound)
	for time.Now().Before(deadline) {
		if listening(addr) {
			return true
		}
		select {
		case <-done:
			t.Logf("%s exited without serving: %s", bin, stderr.String())
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// baseEnv is what a run inherits: PATH, HOME and the race runtime's
// options (the Makefile's GORACE), nothing of the binary's own variables.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GORACE=" + os.Getenv("GORACE")}
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Case is one run of a binary's words and what must come of it.
type Case struct {
	Args []string
	Code int
	// Out is a text the stream for the outcome must hold: stdout when Code
	// is 0 (help), stderr otherwise (the refusal and the usage); the other
	// stream must then be empty.
	Out string
}

// RunCases runs every case as a subtest through Run.
func RunCases(t *testing.T, bin string, env, addrs []string, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(fmt.Sprintf("%q", c.Args), func(t *testing.T) {
			r := Run(t, bin, env, addrs, c.Args...)
			want, other := r.Stdout, r.Stderr
			if c.Code != 0 {
				want, other = r.Stderr, r.Stdout
			}
			if r.Code != c.Code || !strings.Contains(want, c.Out) || other != "" {
				t.Errorf("exit %d, want %d with %q\nstdout: %s\nstderr: %s", r.Code, c.Code, c.Out, r.Stdout, r.Stderr)
			}
		})
	}
}
