package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// zookeeperJar is where Debian's zookeeper package puts the server (its
// manifest names the libraries it needs).
const zookeeperJar = "/usr/share/java/zookeeper.jar"

// ZooKeeper is a standalone ZooKeeper server (Debian package zookeeper, run
// through its server class with a generated zoo.cfg) on a free loopback
// port, its data in its own directory.
type ZooKeeper struct {
	Port int
	Dir  string
	proc *Process
}

// Addr is host:port of the client port.
func (z *ZooKeeper) Addr() string { return fmt.Sprintf("127.0.0.1:%d", z.Port) }

// NewZooKeeper starts ZooKeeper with its files under dir and waits until it
// serves. The caller must Close it.
func NewZooKeeper(dir string) (*ZooKeeper, error) {
	if _, err := os.Stat(zookeeperJar); err != nil {
		return nil, fmt.Errorf("zookeeper is not installed (make test installs it as root: scripts/deps.sh): %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		z := &ZooKeeper{Port: port, Dir: dir}
		if lastErr = z.start(); lastErr == nil {
			return z, nil
		}
	}
	return nil, fmt.Errorf("start zookeeper: %w", lastErr)
}

func (z *ZooKeeper) start() error {
	data := filepath.Join(z.Dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return fmt.Errorf("zookeeper dir: %w", err)
	}
	// A generous tick: on a loaded machine a session must not expire
	// because the JVM was descheduled for a second.
	cfg := fmt.Sprintf(`tickTime=2000
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr
minSessionTimeout=4000
maxSessionTimeout=60000
`, data, z.Port)
	cfgPath := filepath.Join(z.Dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("zookeeper config: %w", err)
	}
	logPath := filepath.Join(z.Dir, "zookeeper.log")
	// A small heap: the tests' trees are a few thousand nodes.
	p, err := startProcess("zookeeper", logPath, "java", "-Xmx256m", "-XX:+UseSerialGC", "-Xss512k",
		"-cp", zookeeperJar, "org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath)
	if err != nil {
		return err
	}
	if err := z.waitReady(p, 60*time.Second); err != nil {
		p.Kill()
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("zookeeper on %d: %w; log tail: %s", z.Port, err, tail(out))
	}
	z.proc = p
	return nil
}

// waitReady asks "srvr" (a four-letter command) until the server says it
// serves in standalone mode.
func (z *ZooKeeper) waitReady(p *Process, within time.Duration) error {
	deadline := time.Now().Add(Timeout(within))
	var last string
	for {
		if p.Exited() {
			return fmt.Errorf("exited during start: %v", p.err)
		}
		if out, err := z.fourLetter("srvr"); err == nil && strings.Contains(out, "Mode: standalone") {
			return nil
		} else if err != nil {
			last = err.Error()
		} else {
			last = out
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving after %s: %s", within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (z *ZooKeeper) fourLetter(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", z.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var b strings.Builder
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// Process is the running server; nil while stopped.
func (z *ZooKeeper) Process() *Process { return z.proc }

// Close stops the server. Safe to call more than once.
func (z *ZooKeeper) Close() {
	if z.proc != nil && !z.proc.Exited() {
		z.proc.Stop(10 * time.Second)
	}
}
