// Package wanproxy is a TCP proxy that behaves like a wide-area link: it
// forwards every connection it accepts to one target, each direction
// delayed by its one-way latency with jitter, optionally losing segments,
// and it can be cut and healed. The multi-region test bed (make
// regions-up, the region tests, bench/regions.sh) puts one in front of
// every Redis a region reaches in another region.
//
// What a Link models, and how:
//
//   - Delay and jitter: each chunk read from one side is released to the
//     other at max(arrival + delay × (1 ± jitter), the previous chunk's
//     release), so the stream keeps its order (see schedule).
//   - Connection set-up: a connection's first bytes leave one round trip
//     after it was accepted, the time of TCP's handshake (so they arrive
//     no sooner than one round trip and one delay after it).
//   - Loss: a chunk with a lost segment waits one retransmission timeout
//     (RTO) more, and holds back everything behind it; the stream is never
//     corrupted or reordered, as TCP never is.
//   - Cut (a partition, by default a blackhole): nothing crosses, in either
//     direction, and nothing fails either: open connections stall, new ones
//     are accepted by the proxy (a listener on loopback cannot refuse a
//     handshake the kernel completes) but go nowhere, so a client finds out
//     only by its own timeouts, as it does when a WAN path drops packets.
//     What was sent meanwhile is delivered after Heal, one delay later (the
//     retransmission), including requests whose client gave up; a late
//     reply to them reaches a closed socket. With Config.Reset a cut
//     instead closes every connection and refuses new ones (a firewall
//     that answers with RST).
//
// Concurrency: a Link's methods are safe for concurrent use. Serve owns
// every goroutine of the link's connections and returns after all of them.
package wanproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Config is one link: a listener's connections forwarded to Target.
type Config struct {
	// Name identifies the link (in Stats and the control endpoint), e.g.
	// "b-a": from region b to region a.
	Name string
	// Target is the host:port every accepted connection is forwarded to.
	Target string
	// From and To are the regions the link joins (the client's and the
	// target's): Net cuts and heals links by region.
	From, To string
	// Delay is the one-way latency toward Target; ReturnDelay the one-way
	// latency back (zero: the same as Delay).
	Delay, ReturnDelay time.Duration
	// Jitter is the spread of each chunk's delay as a fraction of it: 0.1
	// draws each delay uniformly from ±10 %. Zero: no jitter.
	Jitter float64
	// Loss is the probability that one segment (1448 bytes) is lost; each
	// loss delays its chunk by RTO (zero: DefaultRTO). Zero: no loss.
	Loss float64
	RTO  time.Duration
	// Reset makes Cut close every connection and refuse new ones, instead
	// of the default blackhole.
	Reset bool
	// Seed seeds the jitter and loss draws; zero draws a seed.
	Seed uint64
	// Dial connects to Target; nil is a net.Dialer with a 5 s timeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Stats are a link's counters since it was made.
type Stats struct {
	Name     string `json:"name"`
	From     string `json:"from"`
	To       string `json:"to"`
	Target   string `json:"target"`
	Cut      bool   `json:"cut"`
	Accepted int64  `json:"accepted"`  // connections accepted
	Open     int64  `json:"open"`      // connections open now
	Bytes    int64  `json:"bytes"`     // bytes delivered, both directions
	Lost     int64  `json:"lost"`      // segment transmissions lost
	DialErrs int64  `json:"dial_errs"` // connections whose target could not be dialled
	DelayMs  int64  `json:"delay_ms"`  // one-way delay toward the target
	ReturnMs int64  `json:"return_ms"` // one-way delay back
}

// Link is one WAN link. The zero value is not usable: call New.
type Link struct {
	cfg Config
	rnd *lockedRand

	mu       sync.Mutex
	cut      bool
	open     chan struct{} // closed while the link is not cut
	healedAt time.Time     // the last Heal (zero: never cut)
	conns    map[*pair]struct{}

	accepted, live, bytes, lost, dialErrs atomic.Int64
}

// New returns a link; it starts nothing (Serve does).
func New(cfg Config) (*Link, error) {
	if cfg.Target == "" {
		return nil, errors.New("wanproxy: Config.Target is empty")
	}
	if cfg.Delay < 0 || cfg.ReturnDelay < 0 || cfg.RTO < 0 {
		return nil, fmt.Errorf("wanproxy %s: negative delay", cfg.Name)
	}
	if cfg.Jitter < 0 || cfg.Jitter >= 1 {
		return nil, fmt.Errorf("wanproxy %s: jitter %v outside [0, 1)", cfg.Name, cfg.Jitter)
	}
	if cfg.Loss < 0 || cfg.Loss >= 1 {
		return nil, fmt.Errorf("wanproxy %s: loss %v outside [0, 1)", cfg.Name, cfg.Loss)
	}
	if cfg.ReturnDelay == 0 {
		cfg.ReturnDelay = cfg.Delay
	}
	if cfg.RTO == 0 {
		cfg.RTO = DefaultRTO
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 5 * time.Second}
		cfg.Dial = d.DialContext
	}
	open := make(chan struct{})
	close(open)
	return &Link{cfg: cfg, rnd: newLockedRand(cfg.Seed), open: open, conns: map[*pair]struct{}{}}, nil
}

// Name is the link's Config.Name.
func (l *Link) Name() string { return l.cfg.Name }

// Cut partitions the link (see the package comment). Cutting a cut link
// does nothing.
func (l *Link) Cut() {
	l.mu.Lock()
	if l.cut {
		l.mu.Unlock()
		return
	}
	l.cut = true
	l.open = make(chan struct{})
	var reset []*pair
	if l.cfg.Reset {
		for p := range l.conns {
			reset = append(reset, p)
		}
	}
	l.mu.Unlock()
	for _, p := range reset {
		p.close()
	}
}

// Heal ends a cut. Healing a link that is not cut does nothing.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		return
	}
	l.cut = false
	l.healedAt = time.Now()
	close(l.open)
}

// IsCut reports whether the link is cut.
func (l *Link) IsCut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	return Stats{
		Name: l.cfg.Name, From: l.cfg.From, To: l.cfg.To, Target: l.cfg.Target, Cut: l.IsCut(),
		Accepted: l.accepted.Load(), Open: l.live.Load(), Bytes: l.bytes.Load(),
		Lost: l.lost.Load(), DialErrs: l.dialErrs.Load(),
		DelayMs: l.cfg.Delay.Milliseconds(), ReturnMs: l.cfg.ReturnDelay.Milliseconds(),
	}
}

// waitOpen waits until the link is not cut and returns the time of the
// last heal (zero when it was never cut), or ctx's error.
func (l *Link) waitOpen(ctx context.Context) (time.Time, error) {
	for {
		l.mu.Lock()
		open, cut, at := l.open, l.cut, l.healedAt
		l.mu.Unlock()
		if !cut {
			return at, nil
		}
		select {
		case <-open:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// Serve accepts connections on ln and forwards them until ctx ends or ln
// fails; it closes ln and every connection, and returns after every
// goroutine it started has returned (nil when ctx ended it).
func (l *Link) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		ln.Close()
	})
	var err error
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("wanproxy %s: accept: %w", l.cfg.Name, aerr)
			}
			break
		}
		l.accepted.Add(1)
		wg.Go(func() { l.handle(ctx, c) })
	}
	cancel()
	wg.Wait()
	return err
}

// pair is one proxied connection: the accepted side and the target side.
type pair struct {
	once       sync.Once
	down, up   net.Conn
	upMu       sync.Mutex
	closedDown bool
}

// close closes both sides (the up side once it exists); it unblocks every
// Read and Write of the pair.
func (p *pair) close() {
	p.once.Do(func() {
		p.down.Close()
		p.upMu.Lock()
		p.closedDown = true
		if p.up != nil {
			p.up.Close()
		}
		p.upMu.Unlock()
	})
}

// setUp records the target side; false when the pair was closed first.
func (p *pair) setUp(c net.Conn) bool {
	p.upMu.Lock()
	defer p.upMu.Unlock()
	if p.closedDown {
		return false
	}
	p.up = c
	return true
}

func (l *Link) handle(ctx context.Context, c net.Conn) {
	accepted := time.Now()
	p := &pair{down: c}
	l.mu.Lock()
	refuse := l.cut && l.cfg.Reset
	if !refuse {
		l.conns[p] = struct{}{}
	}
	l.mu.Unlock()
	if refuse {
		c.Close()
		return
	}
	l.live.Add(1)
	defer func() {
		p.close()
		l.mu.Lock()
		delete(l.conns, p)
		l.mu.Unlock()
		l.live.Add(-1)
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, p.close)
	defer stop()

	// A blackholed handshake does not complete: dial the target only once
	// the link is open.
	healed, err := l.waitOpen(ctx)
	if err != nil {
		return
	}
	up, err := l.cfg.Dial(ctx, "tcp", l.cfg.Target)
	if err != nil {
		l.dialErrs.Add(1)
		return
	}
	if !p.setUp(up) {
		up.Close()
		return
	}
	// The client's first bytes leave after the handshake's round trip
	// (SYN, SYN-ACK) and arrive one delay later.
	start := accepted
	if healed.After(start) {
		start = healed
	}
	start = start.Add(2*l.cfg.Delay + l.cfg.ReturnDelay)
	fwd := &schedule{delay: l.cfg.Delay, jitter: l.cfg.Jitter, loss: l.cfg.Loss, rto: l.cfg.RTO, rnd: l.rnd, last: start}
	back := &schedule{delay: l.cfg.ReturnDelay, jitter: l.cfg.Jitter, loss: l.cfg.Loss, rto: l.cfg.RTO, rnd: l.rnd}
	// A direction that fails closes the pair: the other cannot go on.
	var wg sync.WaitGroup
	wg.Go(func() { l.pump(ctx, c, up, fwd, p.close) })
	wg.Go(func() { l.pump(ctx, up, c, back, p.close) })
	wg.Wait()
}

// chunk is what one Read returned, stamped with its release time.
type chunk struct {
	b      []byte
	at     time.Time
	inCut  bool // read while the link was cut: lost, sent again after the heal
	eof    bool // the source closed its side (a FIN)
	failed bool // the source failed (a reset): the pair ends
}

// pump copies src to dst on schedule s until src ends, and passes its
// close on as a half-close. When a side fails or ctx ends it calls fail
// (which must unblock src's Read) and returns.
func (l *Link) pump(ctx context.Context, src, dst net.Conn, s *schedule, fail func()) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The reader stamps chunks as they arrive; the bounded queue is the
	// sender's socket buffer (a full one stops reading, as a full TCP
	// window does).
	q := make(chan chunk, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			now := time.Now()
			if n > 0 {
				at, lost := s.release(now, n)
				l.lost.Add(int64(lost))
				select {
				case q <- chunk{b: buf[:n], at: at, inCut: l.IsCut()}:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				at, _ := s.release(now, 0)
				select {
				case q <- chunk{at: at, inCut: l.IsCut(), eof: errors.Is(err, io.EOF), failed: !errors.Is(err, io.EOF)}:
				case <-ctx.Done():
				}
				return
			}
		}
	})
	if !l.deliver(ctx, q, dst, s) {
		cancel()
		fail()
	}
}

// deliver writes q's chunks to dst, each at its release time; true when
// the source's close was passed on.
func (l *Link) deliver(ctx context.Context, q <-chan chunk, dst net.Conn, s *schedule) bool {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for c := range q {
		for {
			if !sleepUntil(ctx, timer, c.at) {
				return false
			}
			if !c.inCut && !l.IsCut() {
				break
			}
			// Sent into a partition or due during one: it crosses one
			// delay after the heal, as a retransmission does.
			healed, err := l.waitOpen(ctx)
			if err != nil {
				return false
			}
			c.inCut = false
			if t := healed.Add(s.delay); t.After(c.at) {
				c.at = t
			}
		}
		switch {
		case c.failed:
			return false
		case c.eof:
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				return cw.CloseWrite() == nil
			}
			return false // no half-close: the pair ends
		}
		n, err := dst.Write(c.b)
		l.bytes.Add(int64(n))
		if err != nil {
			return false
		}
	}
	return false // the reader stopped on ctx
}

// sleepUntil waits until t or ctx's end (false).
func sleepUntil(ctx context.Context, timer *time.Timer, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		timer.Stop()
		return false
	}
}
