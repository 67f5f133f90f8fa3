package h2grpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

const (
	// recvWindow is the flow-control window this client grants for each
	// stream and for the connection: HTTP/2's default, never enlarged, so
	// answers larger than it (or many small ones) need WINDOW_UPDATEs.
	recvWindow = 65535
	// maxResponse bounds one answer's message.
	maxResponse = 4 << 20
	// handshakeTimeout bounds the dial and the SETTINGS exchange.
	handshakeTimeout = 10 * time.Second
	maxStreamID      = 1<<31 - 1
)

// stream is one call in flight. They are reused: a call allocates
// nothing of its own once the pool is warm.
type stream struct {
	id      uint32
	start   time.Time // sent, or (open model) due
	headers bool      // the response headers have come
	msg     []byte    // the response message so far
	unsent  []byte    // the request body's part flow control held back
	window  int64     // what this stream may still send
	recv    int       // DATA received since the last stream WINDOW_UPDATE
}

// conn is one HTTP/2 connection. Its reader goroutine handles every frame
// and, in the closed loop, starts the next call where one ended; the
// open model's scheduler starts calls too, so everything is under mu.
type conn struct {
	sh     *shared
	cfg    *Config
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	fr     *http2.Framer
	target int // calls in flight wanted here

	mu          sync.Mutex
	henc        *hpack.Encoder
	hbuf        bytes.Buffer
	streams     map[uint32]*stream
	free        []*stream
	blocked     []*stream // streams whose body waits for a window
	nextID      uint32
	peerMax     int         // the server's MAX_CONCURRENT_STREAMS
	peerInit    int64       // the server's initial stream window
	peerFrame   int         // the server's MAX_FRAME_SIZE
	sendWin     int64       // the connection's send window
	recvUnacked int         // connection-level DATA not yet given back
	stopping    bool        // start no more calls; close when none is in flight
	dead        bool        // start no more calls: GOAWAY, failure, stream IDs used up
	closed      bool        // closed on purpose: the reader's error is expected
	cutting     atomic.Bool // cut is ending the connection: it counts the calls left
	werr        error       // the first write error (bufio's are sticky)

	outcomes []int64
	errors   map[string]int64
	samples  map[string]string
	dropped  int64
	hist     *hdrhistogram.Histogram
}

func dial(ctx context.Context, sh *shared, target int) (*conn, error) {
	d := net.Dialer{Timeout: handshakeTimeout}
	nc, err := d.DialContext(ctx, "tcp", sh.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("h2grpc: dial %s: %w", sh.cfg.Addr, err)
	}
	c := &conn{
		sh: sh, cfg: sh.cfg, nc: nc, target: target,
		br:      bufio.NewReaderSize(nc, 64<<10),
		bw:      bufio.NewWriterSize(nc, 64<<10),
		streams: map[uint32]*stream{},
		nextID:  1,
		peerMax: maxStreamID, peerInit: 65535, peerFrame: 16384, sendWin: 65535,
		outcomes: make([]int64, len(sh.cfg.Outcomes)),
		errors:   map[string]int64{},
		samples:  map[string]string{},
		hist:     newHist(),
	}
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil) // SETTINGS_HEADER_TABLE_SIZE left at its default
	if err := c.handshake(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("h2grpc: HTTP/2 handshake with %s: %w", sh.cfg.Addr, err)
	}
	return c, nil
}

// handshake sends the preface and this client's SETTINGS, then applies
// and acknowledges the server's, which must come first (RFC 9113 3.4),
// before any call: MAX_CONCURRENT_STREAMS is known before streams open.
func (c *conn) handshake() error {
	c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.nc.SetDeadline(time.Time{})
	c.bw.WriteString(http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow})
	if err := c.bw.Flush(); err != nil {
		return err
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return fmt.Errorf("the server's first frame is %v, not SETTINGS", f.Header())
	}
	c.applySettings(sf)
	c.fr.WriteSettingsAck()
	return c.bw.Flush()
}

func (c *conn) applySettings(sf *http2.SettingsFrame) {
	sf.ForeachSetting(func(s http2.Setting) error {
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			c.peerMax = int(min(s.Val, maxStreamID))
		case http2.SettingInitialWindowSize:
			// A change applies to the streams already open (RFC 9113 6.9.2).
			delta := int64(s.Val) - c.peerInit
			c.peerInit = int64(s.Val)
			for _, st := range c.streams {
				st.window += delta
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
}

func (c *conn) limit() int { return min(c.target, c.peerMax) }

// fill starts calls (closed loop) until target are in flight.
func (c *conn) fill() {
	if c.cfg.Rate > 0 {
		return
	}
	for !c.stopping && !c.dead && c.werr == nil && len(c.streams) < c.limit() {
		if !c.sh.take() {
			c.stopping = true
			return
		}
		c.open(time.Now())
	}
}

// offer starts a call that is due now (open model), or drops it when
// every stream is busy.
func (c *conn) offer(due time.Time) {
	if c.stopping || c.dead || c.werr != nil {
		return
	}
	if len(c.streams) >= c.limit() {
		c.dropped++
		return
	}
	if !c.sh.take() {
		c.stopping = true
		return
	}
	c.open(due)
}

// open starts one call: its HEADERS, and as much of its body as the
// windows allow.
func (c *conn) open(start time.Time) {
	if c.nextID > maxStreamID {
		c.dead = true
		c.sh.giveBack()
		return
	}
	id := c.nextID
	c.nextID += 2
	body := c.cfg.Bodies[c.sh.next.Add(1)%uint64(len(c.cfg.Bodies))]
	c.hbuf.Reset()
	c.field(":method", "POST")
	c.field(":scheme", "http")
	c.field(":path", c.cfg.Path)
	c.field(":authority", c.cfg.Addr)
	c.field("content-type", "application/grpc")
	c.field("te", "trailers")
	for _, h := range c.cfg.Headers {
		c.field(h[0], h[1])
	}
	block := c.hbuf.Bytes()
	first := block[:min(len(block), c.peerFrame)]
	block = block[len(first):]
	c.write(c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0}))
	for len(block) > 0 {
		part := block[:min(len(block), c.peerFrame)]
		block = block[len(part):]
		c.write(c.fr.WriteContinuation(id, len(block) == 0, part))
	}
	var s *stream
	if n := len(c.free); n > 0 {
		s, c.free = c.free[n-1], c.free[:n-1]
	} else {
		s = &stream{}
	}
	s.id, s.start, s.window, s.unsent = id, start, c.peerInit, body
	c.streams[id] = s
	if !c.sendBody(s) {
		c.blocked = append(c.blocked, s)
	}
}

func (c *conn) field(name, value string) {
	c.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

// sendBody sends what the connection's and the stream's windows allow of
// the stream's body, in frames the server accepts; it reports whether
// all of it went.
func (c *conn) sendBody(s *stream) bool {
	for len(s.unsent) > 0 {
		n := min(int64(len(s.unsent)), int64(c.peerFrame), c.sendWin, s.window)
		if n <= 0 {
			return false
		}
		chunk := s.unsent[:n]
		s.unsent = s.unsent[n:]
		c.sendWin -= n
		s.window -= n
		c.write(c.fr.WriteData(s.id, len(s.unsent) == 0, chunk))
	}
	return true
}

// unblock sends what new window allows of the held-back bodies.
func (c *conn) unblock() {
	kept := c.blocked[:0]
	for _, s := range c.blocked {
		if !c.sendBody(s) {
			kept = append(kept, s)
		}
	}
	clear(c.blocked[len(kept):])
	c.blocked = kept
}

func (c *conn) write(err error) {
	if err != nil && c.werr == nil {
		c.werr = err
	}
}

func (c *conn) flush() { c.write(c.bw.Flush()) }

// readLoop handles the server's frames until the connection is done.
func (c *conn) readLoop() {
	for {
		f, err := c.fr.ReadFrame()
		c.mu.Lock()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) && !c.closed {
				// One stream's frame was bad (e.g. its headers too large): the
				// connection goes on.
				if s := c.streams[se.StreamID]; s != nil {
					c.fail(s, "malformed answer", err.Error(), true)
				}
			} else {
				if !c.closed && !c.cutting.Load() {
					c.failAll("connection lost", err.Error())
				}
				c.mu.Unlock()
				return
			}
		} else {
			c.handle(f)
		}
		if c.werr != nil {
			c.failAll("write failed", c.werr.Error())
		} else if c.br.Buffered() == 0 {
			c.flush() // nothing more to read now: send what the frames read so far asked for, in one write
		}
		if c.stopping && len(c.streams) == 0 {
			c.flush()
			c.closeConn()
		}
		c.mu.Unlock()
	}
}

func (c *conn) handle(f http2.Frame) {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		c.onHeaders(f)
	case *http2.DataFrame:
		c.onData(f)
	case *http2.RSTStreamFrame:
		if s := c.streams[f.StreamID]; s != nil {
			c.fail(s, "RST_STREAM "+f.ErrCode.String(), "the server reset the stream", false)
			c.fill()
		}
	case *http2.SettingsFrame:
		if !f.IsAck() {
			c.applySettings(f)
			c.write(c.fr.WriteSettingsAck())
			c.unblock()
			c.fill()
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.sendWin += int64(f.Increment)
		} else if s := c.streams[f.StreamID]; s != nil {
			s.window += int64(f.Increment)
		}
		c.unblock()
	case *http2.PingFrame:
		if !f.IsAck() {
			c.write(c.fr.WritePing(true, f.Data))
		}
	case *http2.GoAwayFrame:
		// Streams above LastStreamID were not and will not be processed;
		// the others may still be answered. No new calls here.
		c.dead = true
		for id, s := range c.streams {
			if id > f.LastStreamID {
				c.fail(s, "GOAWAY "+f.ErrCode.String(), string(f.DebugData()), false)
			}
		}
		c.stopping = true
	}
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) {
	s := c.streams[f.StreamID]
	if s == nil {
		return // a stream this client already gave up
	}
	if !s.headers {
		s.headers = true
		if st := f.PseudoValue("status"); st != "200" {
			c.fail(s, "HTTP status "+st, "", !f.StreamEnded())
			return
		}
		if ct := contentType(f); !strings.HasPrefix(ct, "application/grpc") {
			c.fail(s, "not a gRPC answer", "content-type "+ct, !f.StreamEnded())
			return
		}
		if !f.StreamEnded() {
			return // the message and the trailers follow
		}
		// Trailers-Only: the gRPC status is in these headers.
	} else if !f.StreamEnded() {
		c.fail(s, "trailers without END_STREAM", "", true)
		return
	}
	c.finish(s, f.RegularFields())
}

func contentType(f *http2.MetaHeadersFrame) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == "content-type" {
			return hf.Value
		}
	}
	return ""
}

func (c *conn) onData(f *http2.DataFrame) {
	n := int(f.Header().Length) // padding counts against the windows too
	c.recvUnacked += n
	if c.recvUnacked >= recvWindow/2 {
		c.write(c.fr.WriteWindowUpdate(0, uint32(c.recvUnacked)))
		c.recvUnacked = 0
	}
	s := c.streams[f.StreamID]
	if s == nil {
		return
	}
	switch {
	case !s.headers:
		c.fail(s, "DATA before the response headers", "", !f.StreamEnded())
	case len(s.msg)+len(f.Data()) > maxResponse:
		c.fail(s, "answer larger than 4 MiB", "", !f.StreamEnded())
	case f.StreamEnded():
		c.fail(s, "no grpc-status trailers", "the stream ended after its DATA", false)
	default:
		s.msg = append(s.msg, f.Data()...)
		s.recv += n
		if s.recv >= recvWindow/2 {
			c.write(c.fr.WriteWindowUpdate(s.id, uint32(s.recv)))
			s.recv = 0
		}
	}
}

// finish ends an answered call: its gRPC status, then its message.
func (c *conn) finish(s *stream, trailers []hpack.HeaderField) {
	status, message, found := "", "", false
	for _, hf := range trailers {
		switch hf.Name {
		case "grpc-status":
			status, found = hf.Value, true
		case "grpc-message":
			message = hf.Value
		}
	}
	switch {
	case !found:
		c.fail(s, "no grpc-status", "the trailers lack grpc-status", false)
	case status != "0":
		code, err := strconv.ParseUint(status, 10, 32)
		kind := "grpc-status " + status
		if err == nil {
			kind = "grpc-status " + codes.Code(code).String()
		}
		c.fail(s, kind, message, false)
	case len(s.msg) < 5 || s.msg[0] != 0 || int(binary.BigEndian.Uint32(s.msg[1:5])) != len(s.msg)-5:
		c.fail(s, "malformed gRPC message", fmt.Sprintf("%d bytes, expected one uncompressed message", len(s.msg)), false)
	default:
		i, err := c.cfg.Classify(s.msg[5:])
		if err != nil {
			c.fail(s, "undecodable answer", err.Error(), false)
			break
		}
		c.outcomes[i]++
		c.hist.RecordValue(max(1, time.Since(s.start).Microseconds()))
		c.release(s)
	}
	c.fill()
}

// fail ends a call as an error of kind; reset asks the server to stop
// sending on the stream (it has not ended it).
func (c *conn) fail(s *stream, kind, detail string, reset bool) {
	c.errors[kind]++
	if _, ok := c.samples[kind]; !ok {
		c.samples[kind] = strings.TrimSpace(detail)
	}
	if reset {
		c.write(c.fr.WriteRSTStream(s.id, http2.ErrCodeCancel))
	}
	c.release(s)
}

func (c *conn) release(s *stream) {
	delete(c.streams, s.id)
	if len(s.unsent) > 0 {
		for i, b := range c.blocked {
			if b == s {
				c.blocked = append(c.blocked[:i], c.blocked[i+1:]...)
				break
			}
		}
	}
	*s = stream{msg: s.msg[:0]}
	c.free = append(c.free, s)
}

// failAll ends every call in flight as an error and the connection.
func (c *conn) failAll(kind, detail string) {
	for _, s := range c.streams {
		c.fail(s, kind, detail, false)
	}
	c.dead = true
	c.closeConn()
}

func (c *conn) closeConn() {
	if !c.closed {
		c.closed = true
		c.nc.Close()
	}
}

// stop starts no more calls; the reader closes the connection when the
// last call in flight ends.
func (c *conn) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopping = true
	if len(c.streams) == 0 {
		c.flush()
		c.closeConn()
	}
}

// cut ends the calls still in flight after the grace period. It closes
// the connection before taking mu: a write to a server that stopped
// reading blocks while holding mu, and only the close ends it.
func (c *conn) cut(why string) {
	c.cutting.Store(true)
	c.nc.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failAll("unanswered at the end", why)
}

// schedule starts calls at fixed intervals from start until end (open
// model): a call's latency counts from when it was due.
func (c *conn) schedule(ctx context.Context, start, end time.Time, interval time.Duration) {
	next := start
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		now := time.Now()
		if !now.Before(end) {
			return
		}
		if wait := next.Sub(now); wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			continue
		}
		c.mu.Lock()
		for !next.After(now) && next.Before(end) {
			c.offer(next)
			next = next.Add(interval)
		}
		if c.werr != nil {
			c.failAll("write failed", c.werr.Error())
		} else {
			c.flush()
		}
		done := c.stopping || c.dead
		c.mu.Unlock()
		if done {
			return
		}
	}
}
