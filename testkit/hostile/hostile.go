// Package hostile is the shared part of the hostile-traffic tests (the
// TestHostile* tests of the binaries, run by `make stress-test`): the gate
// that keeps them out of `make test`, slow and idle clients that hold
// connections open the way a slowloris attack does, and latency summaries.
// Everything is loopback and bounded in count and time.
package hostile

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Gate skips t unless RATEWARDEN_HOSTILE=1: the hostile tests run in `make
// stress-test` (scripts/stress-test.sh), not in `make test`.
func Gate(t testing.TB) {
	t.Helper()
	if os.Getenv("RATEWARDEN_HOSTILE") != "1" {
		t.Skip("a hostile-traffic test: runs with RATEWARDEN_HOSTILE=1 (make stress-test)")
	}
}

// Slow describes the slow clients SlowClients opens.
type Slow struct {
	Idle        int           // connections that send nothing
	SlowHeaders int           // connections that send a request line, then one header line every Every
	SlowBodies  int           // connections that send whole headers, then one byte of the body every Every
	Method      string        // of the slow requests; default POST
	Path        string        // of the slow requests; default /
	Every       time.Duration // the dribble interval; default 500 ms
	Bound       time.Duration // how long the server may take to close them all; default 90 s
}

// Kind is what became of one kind of slow client.
type Kind struct {
	Name           string
	Opened, Closed int           // Closed: by the server, within the bound
	First, Last    time.Duration // when the first and the last were closed, since they opened
	Replies        map[string]int
}

func (k Kind) String() string {
	return fmt.Sprintf("%s: %d of %d closed by the server, between %v and %v after opening; replies %v",
		k.Name, k.Closed, k.Opened, k.First.Round(10*time.Millisecond), k.Last.Round(10*time.Millisecond), k.Replies)
}

// SlowClients opens the slow clients against addr and waits until the
// server has closed every one of them, or the bound passes (then the rest
// are closed here and counted as not closed). A client's end is the
// server's: a read that returns EOF or an error; the first line the server
// sent, if any, is counted in Replies ("" for none).
func SlowClients(ctx context.Context, addr string, s Slow) ([]Kind, error) {
	if s.Method == "" {
		s.Method = "POST"
	}
	if s.Path == "" {
		s.Path = "/"
	}
	if s.Every <= 0 {
		s.Every = 500 * time.Millisecond
	}
	if s.Bound <= 0 {
		s.Bound = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, s.Bound)
	defer cancel()
	kinds := []Kind{{Name: "idle"}, {Name: "slow headers"}, {Name: "slow body"}}
	counts := []int{s.Idle, s.SlowHeaders, s.SlowBodies}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var conns []net.Conn
	for ki, n := range counts {
		kinds[ki].Replies = map[string]int{}
		for range n {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				cancel()
				wg.Wait()
				for _, c := range conns {
					c.Close()
				}
				return kinds, fmt.Errorf("open a %s connection (%d open): %w", kinds[ki].Name, len(conns), err)
			}
			conns = append(conns, c)
			kinds[ki].Opened++
			opened := time.Now()
			closed := make(chan struct{})
			wg.Add(2)
			go func() { // the server's end
				defer wg.Done()
				defer close(closed)
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					io.Copy(io.Discard, c) // the rest of a reply, until the server closes
				}
				took := time.Since(opened)
				if ctx.Err() != nil { // closed here at the bound, not by the server
					return
				}
				mu.Lock()
				defer mu.Unlock()
				k := &kinds[ki]
				k.Closed++
				if k.First == 0 || took < k.First {
					k.First = took
				}
				k.Last = max(k.Last, took)
				k.Replies[strings.TrimSpace(line)]++
			}()
			go func() { // the dribble
				defer wg.Done()
				dribble(ctx, c, ki, s, closed)
			}()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // each reader returns when the server closes, or below
	select {
	case <-done:
	case <-ctx.Done():
		for _, c := range conns {
			c.Close()
		}
		<-done
	}
	for _, c := range conns {
		c.Close()
	}
	return kinds, nil
}

// dribble writes the slow client's bytes until the server closes or ctx ends.
func dribble(ctx context.Context, c net.Conn, kind int, s Slow, closed <-chan struct{}) {
	var first string
	var next func(i int) string
	switch kind {
	case 0:
		return // idle: nothing at all
	case 1:
		first = fmt.Sprintf("%s %s HTTP/1.1\r\nHost: hostile\r\n", s.Method, s.Path)
		next = func(i int) string { return fmt.Sprintf("X-Slow-%d: %d\r\n", i, i) }
	case 2:
		first = fmt.Sprintf("%s %s HTTP/1.1\r\nHost: hostile\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n", s.Method, s.Path)
		next = func(int) string { return " " }
	}
	if _, err := io.WriteString(c, first); err != nil {
		return
	}
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case <-t.C:
		}
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, next(i)); err != nil {
			return
		}
	}
}

// Latencies collects durations (safe for concurrent use).
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// Quantile is the q-quantile (0 < q <= 1) of what was added, 0 if nothing was.
func (l *Latencies) Quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (l *Latencies) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// String is "n=…, p50 …, p99 …, max …".
func (l *Latencies) String() string {
	return fmt.Sprintf("n=%d p50 %v p99 %v max %v", l.Len(),
		l.Quantile(0.5).Round(10*time.Microsecond), l.Quantile(0.99).Round(10*time.Microsecond), l.Quantile(1).Round(10*time.Microsecond))
}
