// Package testenv starts the real servers that the tests talk to —
// redis-server (alone or as a cluster), clickhouse-server (alone or as a
// replicated, sharded cluster with ZooKeeper) and an in-process
// Kafka-protocol broker — on free loopback ports, and always stops them.
//
// A missing server binary is a test failure, never a skip: CI installs them
// (make test, through scripts/deps.sh) and a test that silently skipped
// would prove nothing. The one skip is -short mode (make check), the tier
// that starts no server and no process: see SkipShort.
package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on right now,
// outside the kernel's ephemeral range (see pickPort).
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	return p
}

func freePort() (int, error) { return pickPort(nil, 0) }

// handed are the ports pickPort has returned in this process: a port is
// handed out once, so that tests running in parallel (t.Parallel) never
// pick the same free port between one's pick and its server's bind. A
// test binary uses a few hundred of the ~25,000 ports it picks from.
var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
	// claims holds the port claims of this process open: closing one (or
	// the garbage collector's finalizer) would release its lock.
	claims []*os.File
)

// claimPort takes port p for this process among every process on the
// machine that claims ports this way: the test binaries of other packages,
// which `go test ./...` runs at the same time, each with a handed map of
// its own. Without it, two packages could pick the same free port, and the
// server started second would fail to bind while its test talked to the
// other package's server. The claim is a lock on a file named by the port
// (flock), released by the kernel when the process ends.
func claimPort(p int) bool {
	dir := filepath.Join(os.TempDir(), "ratewarden-testenv-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // no claims to be had: the handed map still holds
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	claims = append(claims, f)
	return true
}

// pickPort returns a loopback port p, not in used, that is free together
// with p+pair when pair is not 0 (a cluster node's bus port).
//
// Every port it returns lies outside the ephemeral range
// (net.ipv4.ip_local_port_range). A port inside it can be taken, between
// the moment it is picked and the moment its server binds it, as the
// source port of any outgoing connection on the machine, among them a
// client that dials it before its server starts and connects to itself;
// the server then fails with "address already in use".
func pickPort(used map[int]bool, pair int) (int, error) {
	lo, hi := ephemeralRange()
	handedMu.Lock()
	defer handedMu.Unlock()
	usable := func(p int) bool {
		if used[p] || handed[p] || (p >= lo && p <= hi) {
			return false
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	for range 500 {
		p := 10000 + rand.IntN(55536-pair)
		if usable(p) && (pair == 0 || !used[p-pair] && usable(p+pair)) &&
			claimPort(p) && (pair == 0 || claimPort(p+pair)) {
			handed[p] = true
			if pair != 0 {
				handed[p+pair] = true
			}
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port outside the ephemeral range %d-%d", lo, hi)
}

// ephemeralRange is the kernel's range of source ports for outgoing
// connections, Linux's default when it cannot be read, or an empty range
// when it leaves too few ports above 10000 to choose from.
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil {
				lo, hi = l, h
			}
		}
	}
	if max(lo, 10000)-10000+65535-min(hi, 65535) < 20000 {
		return 1, 0
	}
	return lo, hi
}

// waitTCP waits until addr accepts connections or the deadline passes.
func waitTCP(addr string, within time.Duration) error {
	deadline := time.Now().Add(Timeout(within))
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections after %s: %w", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Process is a server started by the harness.
type Process struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProcess(name string, logPath string, bin string, args ...string) (*Process, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s is not installed (make test installs it as root: scripts/deps.sh): %w", bin, err)
	}
	cmd := exec.Command(path, args...)
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, fmt.Errorf("create log %s: %w", logPath, err)
		}
		cmd.Stdout, cmd.Stderr = f, f
	}
	// Own process group so a test's kill reaches the server and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the server's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the server (SIGSTOP pauses it, SIGCONT resumes it).
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill ends the process with SIGKILL and waits for it.
func (p *Process) Kill() {
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT) // a paused process must be able to die
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop sends SIGTERM and waits up to grace, then kills.
func (p *Process) Stop(grace time.Duration) {
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}
