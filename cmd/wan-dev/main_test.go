package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestConfig(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := config(env(map[string]string{
		"WAN_DEV_LINKS": "b-a=127.0.0.1:26391>127.0.0.1:16379@15ms, c-a=127.0.0.1:36391>127.0.0.1:16379@40ms",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.control != "127.0.0.1:16400" || len(c.links) != 2 {
		t.Fatalf("%+v", c)
	}
	l := c.links[1]
	if l.listen != "127.0.0.1:36391" || l.cfg.Name != "c-a" || l.cfg.From != "c" || l.cfg.To != "a" ||
		l.cfg.Target != "127.0.0.1:16379" || l.cfg.Delay != 40*time.Millisecond || l.cfg.Jitter != 0.1 || l.cfg.Reset {
		t.Fatalf("%+v", l)
	}
	for _, bad := range []map[string]string{
		{},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2"},
		{"WAN_DEV_LINKS": "ba=127.0.0.1:1>127.0.0.1:2@1ms"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2@-1ms"},
		{"WAN_DEV_LINKS": "b-a=0.0.0.0:1>127.0.0.1:2@1ms"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>10.0.0.1:2@1ms"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2@1ms,b-a=127.0.0.1:3>127.0.0.1:2@1ms"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2@1ms", "WAN_DEV_JITTER": "1.5"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2@1ms", "WAN_DEV_LOSS": "x"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2@1ms", "WAN_DEV_CUT": "drop"},
		{"WAN_DEV_LINKS": "b-a=127.0.0.1:1>127.0.0.1:2@1ms", "WAN_DEV_CONTROL_ADDR": "192.0.2.1:80"},
	} {
		_, err := config(env(bad))
		name := "WAN_DEV_LINKS"
		for k := range bad {
			if k != "WAN_DEV_LINKS" {
				name = k
			}
		}
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: error %v does not name %s", bad, err, name)
		}
	}
}

// freeAddr is a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// run serves the links and the control endpoint, and returns when its
// context ends: a request crosses a link, a cut shows in GET /links.
func TestRunServesLinksAndControl(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	listen, control := freeAddr(t), freeAddr(t)
	cfg, err := config(func(k string) string {
		return map[string]string{
			"WAN_DEV_LINKS":        "b-a=" + listen + ">" + target.Addr().String() + "@1ms",
			"WAN_DEV_CONTROL_ADDR": control,
		}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	var c net.Conn
	for i := 0; ; i++ {
		if c, err = net.Dial("tcp", listen); err == nil {
			break
		}
		if i == 100 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("through the link: %q %v", buf, err)
	}
	resp, err := http.Post("http://"+control+"/cut?region=b", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Get("http://" + control + "/links")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"cut": true`) {
		t.Fatalf("GET /links after a cut: %s", b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
