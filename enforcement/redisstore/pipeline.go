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
// identical; only the transport differs. Reservations, settles (a
// charge is a settle) and the concurrency limits' slot operations ride the
// same lanes as calls of their own kind in the same batches (batch.lua's
// op), each the same Lua function as in its own script (reserve.lua,
// settle.lua, slotset.lua).
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
	"errors"
	"fmt"
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
	// A slot operation's (its set is bucketKey, its TTL ttl): slotset's
	// op, the lease's member, the class's limit and the capacity; slot
	// is its answer.
	sop             uint8
	member          string
	limit, capacity int64
	slot            [5]int64
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
	opSlot                  // a slot operation (slotset.lua)
)

// keys is how many keys the call names in batch.lua's KEYS.
func (c *call) keys() int {
	switch c.op {
	case opDecide:
		return 2
	case opSlot:
		return 1
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

// slot runs slotset.lua's op on the set setKey in the lane's batches
// (Concurrency with a pipe).
func (p *Pipelined) slot(ctx context.Context, setKey, member string, op int, limit, capacity, ttl int64) ([5]int64, error) {
	c := calls.Get().(*call)
	c.ctx, c.op, c.bucketKey = ctx, opSlot, setKey
	c.sop, c.member, c.limit, c.capacity, c.ttl = uint8(op), member, limit, capacity, ttl
	if err := p.await(ctx, c); err != nil {
		return [5]int64{}, err
	}
	r, err := c.slot, c.err
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
