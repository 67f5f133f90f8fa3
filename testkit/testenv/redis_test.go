package testenv

import (
	"net"
	"strings"
	"syscall"
	"testing"
)

func TestRedisStartsAndRestartsEmpty(t *testing.T) {
	r := StartRedis(t)
	if got := redisCommand(t, r.Addr(), "SET k v\r\n"); got != "+OK" {
		t.Fatalf("SET: %q", got)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := redisCommand(t, r.Addr(), "EXISTS k\r\n"); got != ":0" {
		t.Fatalf("after restart EXISTS k = %q, want :0", got)
	}
	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r.Close() // must not hang on a paused server
}

func redisCommand(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(cmd)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(buf[:n]))
}
