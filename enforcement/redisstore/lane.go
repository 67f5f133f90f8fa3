package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A lane's side of auto-pipelining (the design is at the top of
// pipeline.go): its queue, the writer that flushes it, and the life of its
// connection (dial, serve the replies, dial again).

// lane is one server's queue and connection.
type lane struct {
	opt     *redis.Options // how to dial the server: the client's, or the master's
	node    *redis.Client  // the server's go-redis client (SCRIPT LOAD after NOSCRIPT)
	cluster bool           // one decision per script call (one slot each)

	mu      sync.Mutex
	queue   []*call
	spare   []*call
	writing bool        // a writer holds the connection's writing side
	conn    *duplexConn // nil while dialling
	down    error       // the last dial's failure, until one succeeds
	closed  bool        // Run has ended
	timer   *time.Timer // MaxDelay's
	args    []byte      // the writer's packed numbers
	armed   bool        // timer is set
}

// enqueue queues c on l and, when no one is writing, writes what is queued.
func (p *Pipelined) enqueue(l *lane, c *call) error {
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return ErrClosed
	case l.down != nil:
		err := l.down
		l.mu.Unlock()
		return fmt.Errorf("redis bucket script for %q: %w", c.bucketKey, err)
	}
	l.queue = append(l.queue, c)
	if !l.writing && l.conn != nil && p.full(l) && p.room(l) {
		l.writing = true
		p.flush(l)
	}
	l.mu.Unlock()
	return nil
}

// full reports whether l's queue is to be written now (MinBatch, MaxDelay);
// when not, it sets the timer that writes it. Called with l.mu held.
func (p *Pipelined) full(l *lane) bool {
	if p.cfg.MaxDelay <= 0 || len(l.queue) >= p.cfg.MinBatch {
		return true
	}
	if !l.armed {
		l.armed = true
		if l.timer == nil {
			l.timer = time.AfterFunc(p.cfg.MaxDelay, func() { p.kick(l) })
		} else {
			l.timer.Reset(p.cfg.MaxDelay)
		}
	}
	return false
}

// kick writes what l has queued, if no one is writing (MaxDelay's timer).
func (p *Pipelined) kick(l *lane) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	if !l.writing && l.conn != nil && len(l.queue) > 0 {
		l.writing = true
		p.flush(l)
	}
}

// resume writes what l has queued, if no one is writing (the reader, once
// a reply made room).
func (p *Pipelined) resume(l *lane) {
	l.mu.Lock()
	if !l.writing && l.conn != nil && len(l.queue) > 0 && p.full(l) {
		l.writing = true
		p.flush(l)
	}
	l.mu.Unlock()
}

// flush writes l's queue to its connection until the queue is empty,
// letting go of l.mu while it writes, so that callers keep queueing and
// their decisions go out in the next write. Called with l.mu held and
// l.writing set, by the one writer; returns with l.mu held.
func (p *Pipelined) flush(l *lane) {
	for len(l.queue) > 0 && l.conn != nil && p.room(l) {
		batch, cn := l.queue, l.conn
		l.queue, l.spare = l.spare[:0], nil
		l.mu.Unlock()
		p.write(l, cn, batch)
		clear(batch)
		l.mu.Lock()
		l.spare = batch[:0]
	}
	l.writing = false
}

// write sends batch on cn, one script call per MaxBatch decisions over one
// server, one per decision over a Cluster, in one flush. A call its caller
// gave up on is answered, not sent (a bucket must not spend a token for
// nobody).
func (p *Pipelined) write(l *lane, cn *duplexConn, batch []*call) {
	kept := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.answer(errVerdict, err)
			continue
		}
		kept = append(kept, c)
	}
	if len(kept) == 0 {
		return
	}
	per := p.cfg.MaxBatch
	if l.cluster {
		per = 1
	}
	now := time.Now()
	var latest time.Time
	for i := 0; i < len(kept); i += per {
		chunk := kept[i:min(i+per, len(kept))]
		g := groups.Get().(*group)
		g.calls = append(g.calls[:0], chunk...)
		g.deadline = now.Add(p.cfg.Timeout)
		for _, c := range chunk {
			c.batch = len(chunk)
			if d, ok := c.ctx.Deadline(); ok && d.After(g.deadline) {
				g.deadline = d
			}
		}
		if i == 0 || g.deadline.After(latest) {
			latest = g.deadline
			_ = cn.nc.SetWriteDeadline(latest)
		}
		if !cn.push(g) {
			failCalls(g.calls, fmt.Errorf("%s: %w", cn.addr, errNotConnected))
			g.recycle()
			continue
		}
		l.args = packArgs(l.args[:0], chunk)
		cn.evalsha(chunk, l.args)
	}
	if err := cn.bw.Flush(); err != nil {
		// The reader's read fails on the closed connection and answers
		// what was pushed.
		_ = cn.nc.Close()
	}
}

// packArgs appends the packed numbers of calls (batch.lua's ARGV[1]).
func packArgs(b []byte, calls []*call) []byte {
	for _, c := range calls {
		if c.op == opSlot {
			b = appendDoubles(b, float64(opSlot), float64(c.sop), float64(c.limit), float64(c.capacity), float64(c.ttl), 0, 0, float64(len(c.member)))
			b = append(b, c.member...)
			continue
		}
		a := decideArgs(c.lim, c.cost, c.quotaEnd)
		if c.op == opSettle {
			a.soft, a.floor = 0, 0 // a settle charges what was spent: no class decides it
			if c.unrecorded {
				a.soft = 1
			}
		}
		b = appendDoubles(b, float64(c.op), a.rate, float64(a.burst), float64(a.cost), float64(a.qlimit), float64(a.qend), a.soft, a.floor)
		if c.op != opDecide {
			b = appendDoubles(b, float64(c.ttl))
		}
	}
	return b
}

// appendDoubles appends fs as little-endian doubles.
func appendDoubles(b []byte, fs ...float64) []byte {
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	return b
}

// appendKeys appends calls' keys (batch.lua's KEYS).
func appendKeys(keys []string, calls []*call) []string {
	for _, c := range calls {
		switch c.op {
		case opSlot:
			keys = append(keys, c.bucketKey)
		case opDecide:
			keys = append(keys, c.bucketKey, c.quotaKey)
		default:
			keys = append(keys, c.bucketKey, c.quotaKey, c.recordKey)
		}
	}
	return keys
}

// close marks l closed and answers its queue with ErrClosed.
func (l *lane) close() {
	l.mu.Lock()
	l.closed = true
	q := l.queue
	l.queue = nil
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	for _, c := range q {
		c.answer(errVerdict, ErrClosed)
	}
}

// Redial waits after a failed dial: doubling from the first, up to the
// last, so that a server back from a restart is reached within a fraction
// of the breaker's open time.
const (
	redialFirst = 10 * time.Millisecond
	redialMax   = 200 * time.Millisecond
)

// runLane keeps l connected until ctx ends: it dials, reads the replies
// until the connection fails or stalls, and dials again.
func (p *Pipelined) runLane(ctx context.Context, l *lane) {
	defer l.close()
	wait := time.Duration(0)
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		cn, err := dialDuplex(ctx, l.opt)
		if err != nil {
			l.mu.Lock()
			l.down = err
			q := l.queue
			l.queue = nil
			l.mu.Unlock()
			failCalls(q, err)
			wait = min(max(2*wait, redialFirst), redialMax)
			continue
		}
		wait = 0
		l.mu.Lock()
		l.conn, l.down = cn, nil
		if !l.writing && len(l.queue) > 0 && p.full(l) {
			l.writing = true
			p.flush(l)
		}
		l.mu.Unlock()
		stop := context.AfterFunc(ctx, func() { _ = cn.nc.Close() })
		err = p.serve(l, cn)
		stop()
		l.mu.Lock()
		if l.conn == cn {
			l.conn = nil
		}
		l.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			err = ErrClosed
		case isTimeout(err):
			err = fmt.Errorf("%s: no reply by the deadline: connection closed: %w", cn.addr, err)
		default:
			err = fmt.Errorf("%s: %w", cn.addr, err)
		}
		cn.fail(err)
	}
}
