package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The replies of auto-pipelining (the design is at the top of
// pipeline.go): the lane's reader answers each decision from its reply,
// and what Redis refused as a whole (NOSCRIPT, MOVED, ASK) is sent again
// through the go-redis client, off the hot path, in a goroutine of Run's.

// serve reads cn's replies and answers their groups, in order, until a read
// fails.
func (p *Pipelined) serve(l *lane, cn *duplexConn) error {
	var failed []failure
	for {
		ln, err := cn.line()
		if err != nil {
			return err
		}
		g := cn.front()
		if g == nil {
			return fmt.Errorf("%w: a reply with nothing in flight", errProtocol)
		}
		var packed []byte
		var refused string
		failed = failed[:0]
		switch ln[0] {
		case '-':
			refused = string(ln[1:])
		case '*':
			n, err := arrayLen(ln)
			if err != nil {
				return err
			}
			for i := range n {
				ln, err := cn.line()
				if err != nil {
					return err
				}
				switch {
				case i == 0 && ln[0] == '$':
					packed, err = cn.readBulk(ln, &cn.bulk, g.resultBytes())
				case i%2 == 1 && ln[0] == ':':
					var at int64
					at, err = parseInt(ln[1:])
					failed = append(failed, failure{at: at})
				case i%2 == 0 && ln[0] == '$' && len(failed) > 0:
					var msg []byte
					msg, err = cn.readBulk(ln, &cn.msg, maxMessageBytes)
					failed[len(failed)-1].msg = string(msg)
				default:
					err = cn.skipAt(ln, 1)
					packed = nil // not batch.lua's reply
				}
				if err != nil {
					return err
				}
			}
		default:
			if err := cn.skip(ln); err != nil {
				return err
			}
		}
		cn.pop()
		if !l.cluster {
			p.resume(l) // a call has left the wire: what queued meanwhile goes
		}
		switch {
		case refused != "":
			p.refused(l, cn, g, refused)
		default:
			answerPacked(g.calls, packed, failed)
			if len(failed) > 0 && strings.HasPrefix(failed[0].msg, "READONLY") {
				_ = cn.nc.Close() // a demoted master: see refused
			}
		}
		g.recycle()
	}
}

// failure is a decision of a script call whose Redis call failed.
type failure struct {
	at  int64 // 1-based, in the call
	msg string
}

// answerPacked answers calls from one batch.lua reply: packed results, and
// the calls that failed.
func answerPacked(calls []*call, packed []byte, failed []failure) {
	want := 0
	for _, c := range calls {
		want += c.resultBytes()
	}
	if len(packed) != want {
		failCalls(calls, fmt.Errorf("%w: %d bytes for %d decisions", errBadReply, len(packed), len(calls)))
		return
	}
	at := 0
	for i, c := range calls {
		n := c.resultBytes()
		b := packed[at : at+n]
		at += n
		if msg, bad := failedAt(failed, int64(i+1)); bad {
			c.answer(errVerdict, fmt.Errorf("redis bucket script for %q: %s", c.bucketKey, msg))
			continue
		}
		var res [9]int64
		for j := range n / 8 {
			res[j] = int64(math.Float64frombits(binary.LittleEndian.Uint64(b[8*j:])))
		}
		if c.op == opSlot {
			copy(c.slot[:], res[:5])
			c.answer(errVerdict, nil)
			continue
		}
		if c.op == opSettle {
			r, err := settleReplyOf(c.bucketKey, c.cost, res[:])
			c.st = r
			c.answer(errVerdict, err)
			continue
		}
		c.answer(verdictOf(c.bucketKey, res[:8], nil))
	}
}

// failedAt is the message of the decision at (1-based) among failed.
func failedAt(failed []failure, at int64) (string, bool) {
	for _, f := range failed {
		if f.at == at {
			return f.msg, true
		}
	}
	return "", false
}

// refused handles a script call Redis refused as a whole: NOSCRIPT (send
// it again through the server's go-redis client, as EVAL on NOSCRIPT, which
// loads the script there and nowhere else), MOVED or ASK (send again through
// the cluster client, which follows the redirect and reloads its slot map);
// READONLY closes the connection, so that the lane dials the master again;
// any other error (LOADING, …) is the decisions' error.
func (p *Pipelined) refused(l *lane, cn *duplexConn, g *group, msg string) {
	var via func(ctx context.Context, calls []*call)
	switch {
	case strings.HasPrefix(msg, "READONLY"):
		// A master demoted under a live connection (a Sentinel failover):
		// dial again, which finds the new master. (Inside batch.lua the
		// refusal is a decision's failure; serve closes the connection
		// on it alike.)
		failCalls(g.calls, errors.New(msg))
		_ = cn.nc.Close()
		return
	case strings.HasPrefix(msg, "NOSCRIPT"):
		via = func(ctx context.Context, calls []*call) { sendVia(ctx, l.node, calls, !l.cluster) }
	case p.cluster != nil && (strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")):
		via = p.viaCluster
	default:
		failCalls(g.calls, errors.New(msg))
		return
	}
	if !p.later(slices.Clone(g.calls), g.deadline, via) {
		failCalls(g.calls, ErrClosed)
	}
}

// slowCall is calls to send through the go-redis client (later).
type slowCall struct {
	calls    []*call
	deadline time.Time
	fn       func(ctx context.Context, calls []*call)
}

// later sends calls through fn in a goroutine of Run's, with a deadline
// (asked before Run, when Run starts); false once Run has ended (nothing
// was started).
func (p *Pipelined) later(calls []*call, deadline time.Time, fn func(ctx context.Context, calls []*call)) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return false
	case !p.running:
		p.early = append(p.early, slowCall{calls, deadline, fn})
	default:
		p.start(slowCall{calls, deadline, fn})
	}
	return true
}

// start runs sc in a goroutine Run waits for. Called with p.mu held.
func (p *Pipelined) start(sc slowCall) {
	p.slow.Add(1)
	go func() {
		defer p.slow.Done()
		ctx, cancel := context.WithDeadline(context.Background(), sc.deadline)
		defer cancel()
		sc.fn(ctx, sc.calls)
	}()
}

// deadline is the deadline of a script call of c alone.
func (p *Pipelined) deadline(c *call) time.Time {
	d := time.Now().Add(p.cfg.Timeout)
	if cd, ok := c.ctx.Deadline(); ok && cd.After(d) {
		d = cd
	}
	return d
}

// viaCluster sends each call through the cluster client, which finds the
// key's master (loading the slot map if it has none) and follows MOVED and
// ASK.
func (p *Pipelined) viaCluster(ctx context.Context, calls []*call) {
	for _, c := range calls {
		if sendVia(ctx, p.cluster, []*call{c}, false) {
			p.routable.Store(true)
		}
	}
}

// sendVia sends calls (one script call when whole, else one each) through
// a go-redis client and answers them; true when Redis answered one.
func sendVia(ctx context.Context, rdb redis.Scripter, calls []*call, whole bool) bool {
	per := 1
	if whole {
		per = len(calls)
	}
	ok := false
	for i := 0; i < len(calls); i += per {
		chunk := calls[i:min(i+per, len(calls))]
		keys := appendKeys(make([]string, 0, 3*len(chunk)), chunk)
		cmd := batchScript.run(ctx, rdb, keys, packArgs(nil, chunk)) // EVALSHA, then EVAL on NOSCRIPT; never resent (spend.go)
		answer(chunk, cmd)
		ok = ok || cmd.Err() == nil
	}
	return ok
}

// batchSHA is batch.lua's SHA1.
var batchSHA = batchScript.Hash()

// answer reads one batch.lua reply from go-redis and answers its calls.
func answer(calls []*call, cmd *redis.Cmd) {
	reply, err := cmd.Slice()
	if err != nil {
		failCalls(calls, err)
		return
	}
	packed, ok := "", len(reply)%2 == 1
	if ok {
		packed, ok = reply[0].(string)
	}
	if !ok {
		failCalls(calls, fmt.Errorf("%w: %d values", errBadReply, len(reply)))
		return
	}
	var failed []failure
	for i := 1; i+1 < len(reply); i += 2 {
		n, _ := reply[i].(int64)
		msg, _ := reply[i+1].(string)
		failed = append(failed, failure{at: n, msg: msg})
	}
	answerPacked(calls, []byte(packed), failed)
}
