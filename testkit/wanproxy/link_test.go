package wanproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The release times: never before arrival + delay × (1 − jitter), never
// after arrival + delay × (1 + jitter) unless held back by the chunk ahead,
// never before the chunk ahead (order), and a loss adds RTO.
func TestScheduleKeepsOrderWithinJitter(t *testing.T) {
	const d = 40 * time.Millisecond
	s := &schedule{delay: d, jitter: 0.1, rnd: newLockedRand(7)}
	t0 := time.Unix(1000, 0)
	var prev time.Time
	held := 0
	for i := range 10000 {
		arrival := t0.Add(time.Duration(i) * 500 * time.Microsecond) // faster than the jitter's spread
		at, lost := s.release(arrival, 100)
		if lost != 0 {
			t.Fatalf("chunk %d: %d losses with Loss 0", i, lost)
		}
		if at.Before(prev) {
			t.Fatalf("chunk %d released at %v, before the chunk ahead (%v)", i, at, prev)
		}
		if lo := arrival.Add(d * 9 / 10); at.Before(lo) {
			t.Fatalf("chunk %d: released %v after arrival, less than delay − 10%%", i, at.Sub(arrival))
		}
		if hi := arrival.Add(d * 11 / 10); at.After(hi) {
			if !at.Equal(prev) {
				t.Fatalf("chunk %d: released %v after arrival, more than delay + 10%%, not held back", i, at.Sub(arrival))
			}
		}
		if at.Equal(prev) {
			held++
		}
		prev = at
	}
	if held == 0 {
		t.Fatal("no chunk was held back by the one ahead: the jitter does not spread the delays")
	}
}

func TestScheduleLossAddsRetransmitTimeouts(t *testing.T) {
	s := &schedule{delay: 10 * time.Millisecond, loss: 0.2, rto: DefaultRTO, rnd: newLockedRand(3)}
	t0 := time.Unix(1000, 0)
	lostChunks, total := 0, 0
	for i := range 2000 {
		arrival := t0.Add(time.Duration(i) * 30 * time.Second) // far apart: no chunk holds another back
		at, lost := s.release(arrival, 1000)                   // one segment
		total += lost
		if lost > 0 {
			lostChunks++
		}
		// One RTO for the first loss, doubling after: 200, 600, 1400 ms...
		want := 10 * time.Millisecond
		for k, rto := 0, DefaultRTO; k < lost; k, rto = k+1, rto*2 {
			want += rto
		}
		if got := at.Sub(arrival); got != want {
			t.Fatalf("chunk %d with %d losses: released after %v, want %v", i, lost, got, want)
		}
	}
	// 2000 draws at p = 0.2: about 400 chunks hit; far from 0 and 2000.
	if lostChunks < 250 || lostChunks > 550 {
		t.Fatalf("%d of 2000 one-segment chunks lost at Loss 0.2", lostChunks)
	}
	if total < lostChunks {
		t.Fatalf("%d losses in %d chunks", total, lostChunks)
	}
}

// pipeListener hands net.Pipe ends to Serve: a link under synctest's
// fake clock, with exact times.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (p *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}
func (p *pipeListener) Close() error   { p.once.Do(func() { close(p.done) }); return nil }
func (p *pipeListener) Addr() net.Addr { return &net.TCPAddr{} }

// dial connects a client to the link.
func (p *pipeListener) dial() net.Conn {
	c, s := net.Pipe()
	p.conns <- s
	return c
}

// echoDial is a target that answers every read with the same bytes.
func echoDial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	go func() {
		defer s.Close()
		io.Copy(s, s)
	}()
	return c, nil
}

// startLink serves a link on a pipe listener until the test ends.
func startLink(t *testing.T, cfg Config) (*Link, *pipeListener) {
	t.Helper()
	cfg.Dial = echoDial
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := newPipeListener()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return l, ln
}

// roundTrip writes msg and reads the echo, returning the time it took.
func roundTrip(t *testing.T, c net.Conn, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != msg {
		t.Fatalf("echo %q, want %q", buf, msg)
	}
	return time.Since(start)
}

func TestLinkDelaysEachDirection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ln := startLink(t, Config{Name: "b-a", Target: "a", Delay: 15 * time.Millisecond, ReturnDelay: 25 * time.Millisecond})
		c := ln.dial()
		defer c.Close()
		// The first exchange pays the handshake's round trip too.
		if got, want := roundTrip(t, c, "hello"), 40*time.Millisecond+40*time.Millisecond; got != want {
			t.Fatalf("first round trip %v, want %v (handshake + request + reply)", got, want)
		}
		for range 3 {
			if got, want := roundTrip(t, c, "again"), 40*time.Millisecond; got != want {
				t.Fatalf("round trip %v, want %v", got, want)
			}
		}
	})
}

func TestLinkJitterStaysWithinTenPerCent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ln := startLink(t, Config{Target: "a", Delay: 50 * time.Millisecond, Jitter: 0.1, Seed: 11})
		c := ln.dial()
		defer c.Close()
		roundTrip(t, c, "x")
		lo, hi := time.Hour, time.Duration(0)
		for range 200 {
			d := roundTrip(t, c, "x")
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < 90*time.Millisecond || hi > 110*time.Millisecond {
			t.Fatalf("round trips from %v to %v, want within 100 ms ± 10%%", lo, hi)
		}
		if hi-lo < 10*time.Millisecond {
			t.Fatalf("round trips from %v to %v: no jitter", lo, hi)
		}
	})
}

func TestLinkCutBlackholesUntilHeal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, ln := startLink(t, Config{Name: "b-a", Target: "a", Delay: 10 * time.Millisecond})
		c := ln.dial()
		defer c.Close()
		roundTrip(t, c, "before")

		l.Cut()
		if _, err := c.Write([]byte("during")); err != nil {
			t.Fatalf("a write into a blackhole fails: %v", err)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 6)
		if n, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read across a cut link: %d bytes, %v; want a timeout", n, err)
		}
		// A new connection is accepted and goes nowhere.
		c2 := ln.dial()
		defer c2.Close()
		go c2.Write([]byte("new")) // a pipe has no socket buffer to take it
		c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c2.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a new connection across a cut link read %d bytes, %v; want a timeout", n, err)
		}
		if !l.Stats().Cut {
			t.Fatal("Stats: not cut")
		}

		// After the heal, what was sent crosses one delay later each way.
		l.Heal()
		healed := time.Now()
		c.SetReadDeadline(time.Time{})
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "during" {
			t.Fatalf("after heal: %q, %v", buf, err)
		}
		if got := time.Since(healed); got != 20*time.Millisecond {
			t.Fatalf("held bytes arrived %v after the heal, want 20 ms", got)
		}
		c2.SetReadDeadline(time.Time{})
		if _, err := io.ReadFull(c2, buf[:3]); err != nil || string(buf[:3]) != "new" {
			t.Fatalf("the connection made during the cut, after heal: %q, %v", buf[:3], err)
		}
		roundTrip(t, c, "after")
	})
}

func TestLinkResetCutClosesAndRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, ln := startLink(t, Config{Target: "a", Delay: 5 * time.Millisecond, Reset: true})
		c := ln.dial()
		defer c.Close()
		roundTrip(t, c, "x")
		l.Cut()
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("an open connection survived a reset cut")
		}
		c2 := ln.dial()
		defer c2.Close()
		if _, err := c2.Read(make([]byte, 1)); err == nil {
			t.Fatal("a new connection was accepted across a reset cut")
		}
		l.Heal()
		c3 := ln.dial()
		defer c3.Close()
		roundTrip(t, c3, "y")
	})
}

func TestLinkLossDelaysButNeverCorrupts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, ln := startLink(t, Config{Target: "a", Delay: 5 * time.Millisecond, Loss: 0.3, Seed: 5})
		c := ln.dial()
		defer c.Close()
		roundTrip(t, c, "x")
		slow := 0
		for i := range 100 {
			msg := strings.Repeat(string(rune('a'+i%26)), 100)
			if roundTrip(t, c, msg) >= 10*time.Millisecond+DefaultRTO {
				slow++
			}
		}
		if slow == 0 || l.Stats().Lost == 0 {
			t.Fatalf("loss 0.3: %d slow round trips, %d losses counted", slow, l.Stats().Lost)
		}
	})
}

// Over real loopback sockets: a megabyte each way arrives whole and in
// order, a half-close passes through, and Serve returns when its context
// ends.
func TestLinkOverTCP(t *testing.T) {
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
			go func() {
				defer c.Close()
				io.Copy(c, c) // echo until the client's half-close
			}()
		}
	}()
	l, err := New(Config{Name: "t", Target: target.Addr().String(), Delay: 2 * time.Millisecond, Jitter: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- l.Serve(ctx, ln) }()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := make([]byte, 1<<20)
	rand.Read(want)
	start := time.Now()
	go func() {
		c.Write(want)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c) // ends when the echo's close comes back
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes, not the %d sent in order", len(got), len(want))
	}
	if d := time.Since(start); d < 4*time.Millisecond*9/10 {
		t.Fatalf("a round trip through a 2 ms link took %v", d)
	}
	if s := l.Stats(); s.Bytes != 2<<20 || s.Accepted != 1 {
		t.Fatalf("stats %+v", s)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Open != 0 {
		t.Fatalf("%d connections open after Serve returned", s.Open)
	}
}

func TestNetCutsAndHealsByRegion(t *testing.T) {
	mk := func(from, to string) *Link {
		l, err := New(Config{Name: from + "-" + to, From: from, To: to, Target: "x"})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	n := NewNet(mk("b", "a"), mk("c", "a"), mk("b", "c"))
	cut := func() string {
		var s []string
		for _, l := range n.Links() {
			if l.IsCut() {
				s = append(s, l.Name())
			}
		}
		return strings.Join(s, " ")
	}
	srv := httptest.NewServer(n.Handler())
	defer srv.Close()
	post := func(path string) int {
		resp, err := http.Post(srv.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, step := range []struct {
		path   string
		status int
		cut    string
	}{
		{"/cut?region=b", 200, "b-a b-c"},
		{"/cut?region=c", 200, "b-a c-a b-c"},
		{"/heal?region=b", 200, "c-a b-c"}, // b-c stays: c is still cut off
		{"/heal?region=c", 200, ""},
		{"/cut?link=c-a", 200, "c-a"},
		{"/heal?link=c-a", 200, ""},
		{"/cut?region=z", 404, ""},
		{"/cut?link=z-a", 404, ""},
		{"/cut", 400, ""},
	} {
		if got := post(step.path); got != step.status {
			t.Fatalf("POST %s: %d, want %d", step.path, got, step.status)
		}
		if got := cut(); got != step.cut {
			t.Fatalf("after POST %s: cut %q, want %q", step.path, got, step.cut)
		}
	}
	resp, err := http.Get(srv.URL + "/links")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"name": "b-c"`) {
		t.Fatalf("GET /links: %s", b)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, c := range []Config{
		{},
		{Target: "x", Delay: -1},
		{Target: "x", Jitter: 1},
		{Target: "x", Loss: -0.1},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}
