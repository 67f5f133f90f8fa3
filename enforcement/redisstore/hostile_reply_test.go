package redisstore_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
)

// hostilePeer is a TCP server on loopback that answers whatever it reads
// on a connection with reply, once, and keeps the connection open: a
// broken or hostile server, not a stand-in for Redis.
func hostilePeer(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				_, _ = io.WriteString(c, reply)
				_, _ = io.Copy(io.Discard, c) // until the client or the cleanup closes it
			}()
		}
	}()
	return ln.Addr().String()
}

// TestDuplexRefusesHugeReplies: a server that announces a bulk string or
// an array longer than any script returns (or nests arrays past what any
// returns) gets a clear error on the decisions of that connection, before
// the limiter allocates what it announced; the same for the handshake's
// replies.
func TestDuplexRefusesHugeReplies(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("*1\r\n", 1_000_000)
	for _, tc := range []struct {
		name, reply, password, want string
	}{
		{"bulk", "$999999999999999\r\n", "", "a bulk string of 999999999999999 bytes announced, at most 65536 expected"},
		{"array", "*900000000000\r\n", "", "an array of 900000000000 elements announced, at most 8193 expected"},
		{"packed results", "*1\r\n$9000000000\r\n", "", "a bulk string of 9000000000 bytes announced, at most 64 expected"},
		{"message", "*3\r\n$64\r\n" + strings.Repeat("\x00", 64) + "\r\n:1\r\n$100000000\r\n", "", "a bulk string of 100000000 bytes announced, at most 65536 expected"},
		{"nesting", deep, "", "arrays nested over 2 deep"},
		{"handshake", "$99999999999\r\n", "secret", "a bulk string of 99999999999 bytes announced, at most 65536 expected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := hostilePeer(t, tc.reply)
			rdb := redis.NewClient(&redis.Options{Addr: addr, Password: tc.password, MaxRetries: -1,
				DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second})
			defer rdb.Close()
			p := redisstore.NewPipelined(rdb, "hostile", redisstore.PipelineConfig{Timeout: time.Minute})
			running(t, p)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // ends a broken run only
			defer cancel()
			_, err := p.Take(ctx, "k", "s", enforcement.Limit{Rate: 1, Burst: 10}, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "redis protocol error") {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}
