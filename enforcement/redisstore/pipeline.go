package redisstore

// Design: auto-pipelining over full-duplex connections. Take puts the
// decision on its lane's queue; when no one is writing to the lane's
// connection, the caller becomes the writer: it writes what is queued
// (its own decision, and whatever arrived while the previous writer was
// busy) in one flush and goes back to wait, without waiting for any reply.
// The lane's one reader takes the replies off the connection in order and
// hands each decision its verdict as soon as its reply is read (duplex.go).
// So a decision waits for one round trip of its own, never for a batch
// ahead of it to come back, and under load the decisions that queue while
// a write is on its way go out together in the next one. The decision is
// the same Lua function as Store's (decide.lua), so decisions are
// identical; only the transport differs. Reservations and settles (a
// charge is a settle) ride the same lanes as calls of their own kind in
// the same batches (batch.lua's op), each the same Lua function as in
// its own script (reserve.lua, settle.lua).
//
// A lane is one server's queue and connection. Over one server there is
// one. Over a Cluster there is one per master, chosen in Take by the master
// the cluster client routes the decision's key to (laneOf), so that a
// master that does not answer holds only its own lane: a stalled
// connection leaves the other masters' decisions untouched.
//
// Over one server (a *redis.Client: standalone or Sentinel) one write's
// decisions are one EVALSHA of batch.lua: Redis parses one command, enters
// Lua once and reads TIME once for all of them, and the numbers go both
// ways as packed doubles (Redis's CPU per decision is the largest cost of
// the allowed path on a shared machine). Over a Cluster, where one script
// may only touch one slot, each decision is its own EVALSHA of batch.lua.
//
// What the lanes need beside a connection goes through the go-redis
// client, off the hot path, in a goroutine of Run's: a decision whose
// Cluster master is not known yet (the slot map not loaded), one refused
// with MOVED or ASK (the cluster client follows the redirect and reloads
// its slot map), and one refused with NOSCRIPT (the script is loaded on
// that server, and the decision sent again). LOADING and any other error
// of Redis's is the decision's error.
//
// The connections and their readers run under Run: NewPipelined starts
// nothing. A lane dials when Run starts it, and again after its connection
// failed or stalled; while a dial fails, its decisions fail at once (the
// guard decides them degraded and counts them) instead of waiting.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
)

// PipelineClient is what auto-pipelining needs of a go-redis client
// (*redis.Client and *redis.ClusterClient are).
type PipelineClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// PipelineConfig tunes auto-pipelining. The zero value of each field is its
// documented default.
type PipelineConfig struct {
	// Workers is how many script calls may be in flight at once on one
	// server's connection (default 1; see defaultInFlight). Over a Cluster,
	// where each decision is a script call of its own, it does not apply.
	Workers int
	// MaxBatch is the most decisions in one script call over one server
	// (default 256, at most 4096); a longer queue is written as several
	// calls in one flush.
	MaxBatch int
	// MinBatch and MaxDelay: a queue holding fewer than MinBatch decisions
	// waits up to MaxDelay for more before it is written (default 0: never
	// wait).
	MinBatch int
	MaxDelay time.Duration
	// Queue is not used (decisions queue while a write is on its way;
	// each caller's context bounds its wait).
	Queue int
	// Timeout bounds one script call's round trip (default 1s), unless the
	// latest deadline among its callers' contexts is later: a caller that
	// may wait longer (GuardSettings.MaxWait, on a starved process) is not
	// failed by a shorter deadline. A connection whose oldest call in
	// flight has no reply by then is judged stalled, closed and dialled
	// again. Each caller's own context bounds its wait.
	Timeout time.Duration
}

// Pipelined is an enforcement.Authority that coalesces concurrent
// decisions into pipelines. It is safe for concurrent use; Run runs its
// connections.
type Pipelined struct {
	store *Store
	rdb   PipelineClient
	// client is rdb as a *redis.Client (one server), or nil.
	client *redis.Client
	// cluster is rdb as a *redis.ClusterClient, or nil.
	cluster *redis.ClusterClient
	// routable: a decision over the Cluster has been answered, so the
	// cluster client holds a slot map and finds a key's master without a
	// network call (it never drops the map once loaded). Until then every
	// decision goes through the cluster client, which loads the map.
	routable atomic.Bool
	cfg      PipelineConfig
	one      *lane // over one server

	mu      sync.Mutex
	running bool                             // Run has begun
	closed  bool                             // Run has ended or is ending: no new lane, no new slow call
	all     []*lane                          // every lane, for Run to start
	lanes   atomic.Pointer[map[string]*lane] // over a Cluster, by master's address; copied on write
	poke    chan struct{}                    // a lane was added
	slow    sync.WaitGroup                   // the calls sent through the go-redis client
	early   []slowCall                       // asked for before Run
}

var _ enforcement.Authority = (*Pipelined)(nil)

type call struct {
	ctx        context.Context // the caller's: a call it gave up on is not sent
	op         callOp
	key, scope string
	lim        enforcement.Limit
	cost       int64
	v          enforcement.Verdict
	st         settleReply // a settle's answer (v is a decision's)
	err        error
	// recordKey, ttl and unrecorded are a reservation's or a settle's:
	// the record's key, its TTL (ms) and whether it has no record.
	recordKey  string
	ttl        int64
	unrecorded bool
	// done receives one value when v and err are set (buffered: the
	// reader never waits for the caller).
	done chan struct{}
	// bucketKey, quotaKey and quotaEnd are set by Take.
	bucketKey, quotaKey string
	quotaEnd            int64
	batch               int // decisions in the script call the call rode in
}

// callOp is what a call asks of batch.lua.
type callOp uint8

const (
	opDecide  callOp = iota // a decision (decide.lua)
	opReserve               // a reservation (reserve.lua)
	opSettle                // a settle or a charge (settle.lua)
)

// keys is how many keys the call names in batch.lua's KEYS.
func (c *call) keys() int {
	if c.op == opDecide {
		return 2
	}
	return 3
}

// resultBytes is the size of c's packed result in batch.lua's reply.
func (c *call) resultBytes() int {
	if c.op == opSettle {
		return settleResultBytes
	}
	return resultBytes
}

// calls recycles call records: a caller that received its answer is the
// last user of its call. One its caller gave up on is left to the GC (the
// reader may still write it).
var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

var errVerdict enforcement.Verdict

func (c *call) answer(v enforcement.Verdict, err error) {
	c.v, c.err = v, err
	c.done <- struct{}{}
}

// recycle returns a call its caller is done with to the pool.
func (c *call) recycle() {
	done := c.done
	*c = call{done: done}
	calls.Put(c)
}

// ErrClosed is returned for decisions asked of a Pipelined store whose Run
// has ended.
var ErrClosed = errors.New("redisstore: pipelined store closed")

// NewPipelined returns an auto-pipelining authority over rdb with the key
// layout of New(rdb, prefix). It starts nothing: decisions are answered
// while Run runs.
func NewPipelined(rdb PipelineClient, prefix string, cfg PipelineConfig) *Pipelined {
	client, _ := rdb.(*redis.Client)
	cluster, _ := rdb.(*redis.ClusterClient)
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	cfg.MaxBatch = min(cfg.MaxBatch, maxCallDecisions) // what a reply may carry (duplex.go)
	if cfg.Workers <= 0 {
		cfg.Workers = defaultInFlight
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	p := &Pipelined{store: New(rdb, prefix), rdb: rdb, client: client, cluster: cluster, cfg: cfg, poke: make(chan struct{}, 1)}
	p.lanes.Store(&map[string]*lane{})
	if cluster == nil {
		if client == nil {
			panic("redisstore: NewPipelined needs a *redis.Client or a *redis.ClusterClient")
		}
		p.one = &lane{opt: client.Options(), node: client}
		p.all = append(p.all, p.one)
	}
	return p
}

// defaultInFlight is how many script calls go on the wire to one server
// before the next write waits for a reply. With no bound, every write went
// out at once and carried only the few decisions queued during the last
// one: with nothing but decisions on the cores (BenchmarkSharedTier, 128
// callers) Redis ran about twice the script calls per decision and
// answered half as many decisions as the batch-per-round-trip pipeline;
// two in flight still answered fewer. With one, a lone decision is written
// by its caller at once, and under load the reader writes what queued the
// moment the reply before it is read, with no hand-off to a worker.
const defaultInFlight = 1

// room reports whether l's connection takes another script call now.
func (p *Pipelined) room(l *lane) bool {
	return l.cluster || l.conn.inflight() < p.cfg.Workers
}

// HeedsCancel declares that Take returns as soon as its context is done
// (HeedsCancel: the guard then needs no goroutine per call).
func (p *Pipelined) HeedsCancel() {}

// Store is the plain store with the same key layout (BucketKey, Lease, Preload).
func (p *Pipelined) Store() *Store { return p.store }

// Run runs the lanes' connections until ctx ends, then answers what is
// queued or in flight with ErrClosed and returns once every goroutine it
// started has returned. It may run once.
func (p *Pipelined) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("redisstore: Pipelined.Run called twice")
	}
	p.running = true
	for _, sc := range p.early {
		p.start(sc)
	}
	p.early = nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	started := 0
	for ctx.Err() == nil {
		p.mu.Lock()
		add := p.all[started:]
		started = len(p.all)
		p.mu.Unlock()
		for _, l := range add {
			wg.Add(1)
			go func() { defer wg.Done(); p.runLane(ctx, l) }()
		}
		select {
		case <-ctx.Done():
		case <-p.poke:
		}
	}
	p.mu.Lock()
	p.closed = true
	never := p.all[started:] // added as Run ended: never dialled
	p.mu.Unlock()
	for _, l := range never {
		l.close()
	}
	wg.Wait()
	p.slow.Wait() // bounded by the calls' deadlines
	return nil
}

// laneOf is the lane of the master the cluster client sends bucketKey to,
// or nil when it does not know the slot's master, and closed is true once
// Run has ended. Called once p.routable: the lookup is then in memory. The
// lanes grow with the masters ever routed to (a failover or a reshard adds
// one); a lane left without keys keeps an idle connection.
func (p *Pipelined) laneOf(ctx context.Context, bucketKey string) (l *lane, closed bool) {
	node, err := p.cluster.MasterForKey(ctx, bucketKey)
	if err != nil {
		return nil, false // the cluster client will say why
	}
	addr := node.Options().Addr
	if l := (*p.lanes.Load())[addr]; l != nil {
		return l, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, true
	}
	lanes := *p.lanes.Load()
	if l := lanes[addr]; l != nil {
		return l, false
	}
	l = &lane{opt: node.Options(), node: node, cluster: true}
	next := make(map[string]*lane, len(lanes)+1)
	for k, v := range lanes {
		next[k] = v
	}
	next[addr] = l
	p.lanes.Store(&next)
	p.all = append(p.all, l)
	select {
	case p.poke <- struct{}{}:
	default:
	}
	return l, false
}

// Take implements enforcement.Authority.
func (p *Pipelined) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	c := p.newCall(ctx, opDecide, key, scope, lim, cost)
	if err := p.await(ctx, c); err != nil {
		return errVerdict, err
	}
	v, err := c.v, c.err
	c.recycle()
	return v, err
}

// Reserve implements enforcement.Reserver: reserve.lua in the lane's
// batches, as a decision is (Store.Reserve is the same script alone).
func (p *Pipelined) Reserve(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64, id string, ttl time.Duration) (enforcement.Verdict, error) {
	c := p.newCall(ctx, opReserve, key, scope, lim, cost)
	c.recordKey, c.ttl = p.store.ReservationKey(key, id), ttlMS(ttl)
	if err := p.await(ctx, c); err != nil {
		return errVerdict, err
	}
	v, err := c.v, c.err
	c.recycle()
	return v, err
}

// Settle implements enforcement.Reserver: settle.lua in the lane's
// batches. A settle is never sent twice (the lane's connection fails
// every call on it rather than resend one), and settle.lua applies an id
// at most once, so a settle whose reply was lost and that the caller
// sends again is answered "already settled".
func (p *Pipelined) Settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (enforcement.Settlement, error) {
	r, err := p.settle(ctx, key, scope, id, lim, cost, unrecorded, ttl)
	if err != nil {
		return enforcement.Settlement{}, err
	}
	return r.result()
}

func (p *Pipelined) settle(ctx context.Context, key, scope, id string, lim enforcement.Limit, cost int64, unrecorded bool, ttl time.Duration) (settleReply, error) {
	c := p.newCall(ctx, opSettle, key, scope, lim, cost)
	c.recordKey, c.ttl, c.unrecorded = p.store.ReservationKey(key, id), ttlMS(ttl), unrecorded
	if err := p.await(ctx, c); err != nil {
		return settleReply{}, err
	}
	r, err := c.st, c.err
	c.recycle()
	return r, err
}

// newCall is a call record for one store call.
func (p *Pipelined) newCall(ctx context.Context, op callOp, key, scope string, lim enforcement.Limit, cost int64) *call {
	c := calls.Get().(*call)
	c.ctx, c.op, c.key, c.scope, c.lim, c.cost = ctx, op, key, scope, lim, cost
	c.bucketKey = p.store.BucketKey(key, scope)
	c.quotaKey, c.quotaEnd = p.store.quotaOf(c.bucketKey, key, lim)
	return c
}

// await sends c on its lane and waits for its answer. nil: c is answered
// (its result fields are set) and the caller recycles it; an error: c is
// not the caller's any more.
func (p *Pipelined) await(ctx context.Context, c *call) error {
	l := p.one
	if p.cluster != nil {
		l = nil
		if p.routable.Load() {
			var closed bool
			if l, closed = p.laneOf(ctx, c.bucketKey); closed {
				c.recycle()
				return ErrClosed
			}
		}
		if l == nil { // the master is not known: through the cluster client
			c.batch = 1
			if !p.later([]*call{c}, p.deadline(c), p.viaCluster) {
				c.recycle()
				return ErrClosed
			}
		}
	}
	if l != nil {
		if err := p.enqueue(l, c); err != nil {
			c.recycle()
			return err
		}
	}
	select {
	case <-c.done:
		reportBatch(ctx, c.batch)
		return nil
	case <-ctx.Done():
		// The call is still answered, by the reader or by the
		// connection's failure; its answer is dropped.
		return fmt.Errorf("redis bucket script for %q: %w", c.bucketKey, ctx.Err())
	}
}

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
		soft := c.lim.SoftLimitPercent
		if c.op == opSettle {
			soft = 0
			if c.unrecorded {
				soft = 1
			}
		}
		for _, f := range [7]float64{float64(c.op), c.lim.Rate, float64(c.lim.Burst), float64(c.cost), float64(c.lim.QuotaLimit), float64(c.quotaEnd), soft} {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
		}
		if c.op != opDecide {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(c.ttl)))
		}
	}
	return b
}

// appendKeys appends calls' keys (batch.lua's KEYS).
func appendKeys(keys []string, calls []*call) []string {
	for _, c := range calls {
		keys = append(keys, c.bucketKey, c.quotaKey)
		if c.op != opDecide {
			keys = append(keys, c.recordKey)
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

// BucketScriptSource is the Lua source of the bucket script, for tools that
// load it themselves (redis-benchmark comparisons).
func BucketScriptSource() string { return stateLua + decideLua + bucketLua }
