package redisstore

// Design: one full-duplex connection to one Redis server (a lane's, see
// pipeline.go). Writers put script calls on the wire as they come and never
// wait for a reply; one reader takes the replies off in the order the calls
// were written (Redis answers a connection's commands in order) and hands
// each to its callers the moment it is read. A group (one script call: a
// batch of decisions over one server, one decision over a Cluster) joins
// the connection's FIFO before its first byte is written, so the reply the
// reader reads is always the FIFO's head's.
//
// The read deadline is the head group's: a server that stops answering (a
// SIGSTOP, a host off the network) leaves the head unanswered past its
// deadline, the read fails, and the connection is closed with every group
// still on it failed; its late replies are never read, so none can reach
// the wrong caller. The lane then dials a new connection. A caller never
// waits for that: its own context (the guard's deadline) ends its wait.
//
// The connection speaks RESP2 itself, dialled with the go-redis client's
// own options (its Dialer carries TLS and, under Sentinel, finds the
// master; its credentials provider, DB and client name are sent as AUTH,
// SELECT and CLIENT SETNAME), so that a store configured for go-redis is
// reached the same way.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// duplexConn is one connection to one server: its writer side is used by
// one writer at a time (the lane's), its reader side by the lane's reader.
type duplexConn struct {
	nc   net.Conn
	addr string
	bw   *bufio.Writer
	br   *bufio.Reader
	num  []byte // the writer's scratch for decimal numbers
	keys []byte // and for the key count
	bulk []byte // the reader's buffers for bulk strings: a reply's packed results,
	msg  []byte // and its failures' messages

	mu     sync.Mutex
	fifo   []*group // written (or being written), not yet answered
	head   int
	closed bool
}

// group is the decisions one script call answers, and when the connection
// that carries it is to be judged stalled.
type group struct {
	calls    []*call
	deadline time.Time
}

var groups = sync.Pool{New: func() any { return new(group) }}

// resultBytes is the size of g's packed results in batch.lua's reply.
func (g *group) resultBytes() int {
	n := 0
	for _, c := range g.calls {
		n += c.resultBytes()
	}
	return n
}

func (g *group) recycle() {
	clear(g.calls)
	g.calls = g.calls[:0]
	groups.Put(g)
}

// errNotConnected is what a call gets when its connection closed under it.
var errNotConnected = errors.New("connection closed")

// dialDuplex opens a connection with opt (a go-redis client's options:
// Dialer, Addr, DialTimeout, credentials, DB, ClientName) and
// authenticates it.
func dialDuplex(ctx context.Context, opt *redis.Options) (*duplexConn, error) {
	timeout := opt.DialTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	network := opt.Network
	if network == "" {
		network = "tcp"
	}
	dial := opt.Dialer
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	nc, err := dial(ctx, network, opt.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", opt.Addr, err)
	}
	c := &duplexConn{nc: nc, addr: opt.Addr, bw: bufio.NewWriterSize(nc, 32<<10)}
	c.br = bufio.NewReaderSize(lateReader{c}, 32<<10)
	if err := c.handshake(ctx, opt); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("connect to %s: %w", opt.Addr, err)
	}
	return c, nil
}

// handshake sends what go-redis sends on a new connection of a RESP2
// client: AUTH, SELECT, CLIENT SETNAME, as configured.
func (c *duplexConn) handshake(ctx context.Context, opt *redis.Options) error {
	if opt.StreamingCredentialsProvider != nil {
		return errors.New("a streaming credentials provider is not supported by the pipelined store")
	}
	user, pass := opt.Username, opt.Password
	switch {
	case opt.CredentialsProviderContext != nil:
		var err error
		if user, pass, err = opt.CredentialsProviderContext(ctx); err != nil {
			return fmt.Errorf("credentials: %w", err)
		}
	case opt.CredentialsProvider != nil:
		user, pass = opt.CredentialsProvider()
	}
	var cmds [][]string
	switch {
	case pass != "" && user != "":
		cmds = append(cmds, []string{"AUTH", user, pass})
	case pass != "":
		cmds = append(cmds, []string{"AUTH", pass})
	}
	if opt.DB > 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(opt.DB)})
	}
	if opt.ClientName != "" {
		cmds = append(cmds, []string{"CLIENT", "SETNAME", opt.ClientName})
	}
	if len(cmds) == 0 {
		return nil
	}
	if d, ok := ctx.Deadline(); ok {
		_ = c.nc.SetDeadline(d)
		defer c.nc.SetDeadline(time.Time{})
	}
	for _, cmd := range cmds {
		c.array(len(cmd))
		for _, a := range cmd {
			c.str(a)
		}
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	for _, cmd := range cmds {
		ln, err := c.line()
		if err != nil {
			return err
		}
		if len(ln) > 0 && ln[0] == '-' {
			return fmt.Errorf("%s: %s", cmd[0], ln[1:]) // never the arguments: a password
		}
		if err := c.skip(ln); err != nil {
			return err
		}
	}
	return nil
}

// push appends g to the FIFO before it is written; false when the
// connection is closed (g was not added).
func (c *duplexConn) push(g *group) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.fifo = append(c.fifo, g)
	if len(c.fifo)-c.head == 1 {
		_ = c.nc.SetReadDeadline(g.deadline)
	}
	return true
}

// inflight is how many groups wait for their reply.
func (c *duplexConn) inflight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fifo) - c.head
}

// front is the group whose reply is next, or nil.
func (c *duplexConn) front() *group {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.head == len(c.fifo) {
		return nil
	}
	return c.fifo[c.head]
}

// pop removes the front group once its reply is read, and moves the read
// deadline to the next one's (none while nothing is in flight).
func (c *duplexConn) pop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fifo[c.head] = nil
	c.head++
	if c.head == len(c.fifo) {
		c.fifo, c.head = c.fifo[:0], 0
		_ = c.nc.SetReadDeadline(time.Time{})
		return
	}
	_ = c.nc.SetReadDeadline(c.fifo[c.head].deadline)
}

// fail closes the connection and answers every group still on it with err.
func (c *duplexConn) fail(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	left := c.fifo[c.head:]
	c.fifo, c.head = nil, 0
	c.mu.Unlock()
	_ = c.nc.Close()
	for _, g := range left {
		failCalls(g.calls, err)
		g.recycle()
	}
}

// failCalls answers calls with err.
func failCalls(calls []*call, err error) {
	for _, c := range calls {
		c.answer(errVerdict, fmt.Errorf("redis bucket script for %q: %w", c.bucketKey, err))
	}
}

// Writing RESP2 (the writer's side).

func (c *duplexConn) header(kind byte, n int) {
	c.num = strconv.AppendInt(append(c.num[:0], kind), int64(n), 10)
	c.num = append(c.num, '\r', '\n')
	_, _ = c.bw.Write(c.num)
}

func (c *duplexConn) array(n int) { c.header('*', n) }

func (c *duplexConn) str(s string) {
	c.header('$', len(s))
	_, _ = c.bw.WriteString(s)
	_, _ = c.bw.WriteString("\r\n")
}

func (c *duplexConn) bytes(b []byte) {
	c.header('$', len(b))
	_, _ = c.bw.Write(b)
	_, _ = c.bw.WriteString("\r\n")
}

// evalsha writes one EVALSHA of batch.lua over the decisions of calls,
// their packed numbers in args (packArgs).
func (c *duplexConn) evalsha(calls []*call, args []byte) {
	n := 0
	for _, k := range calls {
		n += k.keys()
	}
	c.array(3 + n + 1)
	c.str("evalsha")
	c.str(batchSHA)
	nkeys := strconv.AppendInt(c.keys[:0], int64(n), 10)
	c.keys = nkeys
	c.bytes(nkeys)
	for _, k := range calls {
		c.str(k.bucketKey)
		if k.op == opSlot {
			continue
		}
		c.str(k.quotaKey)
		if k.op != opDecide {
			c.str(k.recordKey)
		}
	}
	c.bytes(args)
}

// Reading RESP2 (the reader's side).

var errProtocol = errors.New("redis protocol error")

// line is the next reply line without its CRLF (valid until the next read).
func (c *duplexConn) line() ([]byte, error) {
	ln, err := c.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: a reply line over %d bytes", errProtocol, c.br.Size())
		}
		return nil, err
	}
	if len(ln) < 3 || ln[len(ln)-2] != '\r' {
		return nil, fmt.Errorf("%w: line %q", errProtocol, ln)
	}
	return ln[:len(ln)-2], nil
}

// parseInt reads a RESP integer (no allocation, as strconv's would on the
// string conversion).
func parseInt(b []byte) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, fmt.Errorf("%w: number %q", errProtocol, b)
	}
	var n int64
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("%w: number %q", errProtocol, b)
		}
		n = 10*n + int64(d-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// The largest reply a server may announce on this connection; a longer
// bulk string or array, or deeper nesting, is a broken or hostile peer,
// refused before anything is allocated for it (the connection is then
// closed, and its calls fail). Each is what the scripts can legitimately
// return, with room to spare.
const (
	// maxCallDecisions is the most decisions one script call carries
	// (PipelineConfig.MaxBatch is capped by it).
	maxCallDecisions = 4096
	// resultBytes is one decision's (or reservation's) packed result in
	// batch.lua's reply (8 doubles), settleResultBytes one settle's (9).
	resultBytes       = 64
	settleResultBytes = 72
	// maxMessageBytes bounds an error message, or any other bulk string
	// the connection reads (handshake replies are a few bytes).
	maxMessageBytes = 64 << 10
	// maxReplyElements is batch.lua's longest reply: the packed results,
	// then an index and a message per failed decision.
	maxReplyElements = 1 + 2*maxCallDecisions
	// maxReplyDepth: batch.lua's reply is one array of strings and
	// integers; one nested level is skipped, no more.
	maxReplyDepth = 2
)

// errTooLarge is a reply over one of the caps above.
var errTooLarge = fmt.Errorf("%w: reply over its bound", errProtocol)

// readBulk reads the bytes of a bulk string whose header line is ln
// ("$n"), of at most limit bytes, into *buf; nil for a null bulk. The
// bytes stay valid until the next readBulk into the same buffer.
func (c *duplexConn) readBulk(ln []byte, buf *[]byte, limit int) ([]byte, error) {
	if ln[0] != '$' {
		return nil, fmt.Errorf("%w: %q where a bulk string was expected", errProtocol, ln)
	}
	n, err := parseInt(ln[1:])
	if err != nil || n < 0 {
		return nil, err
	}
	if n > int64(limit) {
		return nil, fmt.Errorf("%w: a bulk string of %d bytes announced, at most %d expected", errTooLarge, n, limit)
	}
	if cap(*buf) < int(n)+2 {
		*buf = make([]byte, n+2)
	}
	b := (*buf)[:n+2]
	if _, err := io.ReadFull(c.br, b); err != nil {
		return nil, err
	}
	return b[:n], nil
}

// arrayLen is the length of the array whose header line is ln ("*n"),
// refused over maxReplyElements.
func arrayLen(ln []byte) (int64, error) {
	n, err := parseInt(ln[1:])
	if err != nil {
		return 0, err
	}
	if n > maxReplyElements {
		return 0, fmt.Errorf("%w: an array of %d elements announced, at most %d expected", errTooLarge, n, maxReplyElements)
	}
	return n, nil
}

// skip reads past the rest of the value whose first line is ln.
func (c *duplexConn) skip(ln []byte) error { return c.skipAt(ln, 0) }

// skipAt is skip of a value nested depth arrays deep.
func (c *duplexConn) skipAt(ln []byte, depth int) error {
	switch ln[0] {
	case '+', '-', ':':
		return nil
	case '$':
		_, err := c.readBulk(ln, &c.msg, maxMessageBytes)
		return err
	case '*':
		if depth >= maxReplyDepth {
			return fmt.Errorf("%w: arrays nested over %d deep", errTooLarge, maxReplyDepth)
		}
		n, err := arrayLen(ln)
		if err != nil {
			return err
		}
		for range n {
			ln, err := c.line()
			if err != nil {
				return err
			}
			if err := c.skipAt(ln, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: reply type %q", errProtocol, ln[0])
}

// stallGrace is how long a read past its deadline may still wait.
const stallGrace = 2 * time.Millisecond

// lateReader reads the connection, and when a read fails on its deadline
// reads once more, briefly, before it reports the timeout: a reply that
// arrived while the reader waited for a CPU (a starved process) is the
// server's answer in time, and a connection is judged stalled only when
// nothing came.
type lateReader struct{ c *duplexConn }

func (r lateReader) Read(p []byte) (int, error) {
	n, err := r.c.nc.Read(p)
	if n > 0 || !isTimeout(err) {
		return n, err
	}
	// Only the reader moves the deadline while a group is in flight (push
	// sets it when the FIFO was empty, which it is not past a deadline).
	_ = r.c.nc.SetReadDeadline(time.Now().Add(stallGrace))
	n, err = r.c.nc.Read(p)
	r.c.mu.Lock()
	if r.c.head < len(r.c.fifo) {
		_ = r.c.nc.SetReadDeadline(r.c.fifo[r.c.head].deadline)
	}
	r.c.mu.Unlock()
	return n, err
}

// isTimeout reports a read that passed its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
