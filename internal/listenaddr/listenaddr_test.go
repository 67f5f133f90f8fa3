package listenaddr_test

import (
	"testing"

	"github.com/ratewarden/ratewarden/internal/listenaddr"
)

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.1.2.3:1": true, "[::1]:8080": true, "localhost:8080": true, "LOCALHOST:1": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "10.0.0.5:8080": false, "192.168.1.1:80": false,
		"limiter.internal:8080": false, "127.0.0.1": false, "": false, "[::ffff:127.0.0.1]:80": true,
	} {
		if got := listenaddr.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
