package redisstore

// Design: auto-pipelining. Take puts the decision on a queue and waits;
// Workers goroutines (one over one server: defaultWorkers) each take what
// is queued (up to MaxBatch, waiting at most MaxDelay for more when fewer
// than MinBatch are there) and send it as one batch, then hand each caller
// its verdict. While a batch is on the wire the queue fills, so under load
// batches grow by themselves and Redis sees few, large writes; a lone
// decision goes out at once (MaxDelay 0 by default). The decision is the
// same Lua function as Store's (decide.lua), so decisions are identical;
// only the transport differs. The workers are owned by the Pipelined
// store: Close stops them.
//
// A queue and its workers are a lane. Over one server there is one. Over
// a Cluster there is one per master, chosen in Take by the master the
// cluster client routes the decision's key to (laneOf), so that a batch
// never spans masters and a master that does not answer holds only its own
// lane: a batch waits for its slowest node, and a worker waits for its
// batch, which on a dead master lasts until the batch's deadline (the
// cluster client redials and retries it meanwhile). With one queue and
// workers for all masters, the batches of a dead master's keys took every
// worker while their callers had long given up, and the live masters'
// decisions queued behind them until their own deadline passed: answered
// degraded, and counted against their own shard's breaker.
//
// Over one Redis server (a *redis.Client: standalone or Sentinel) a whole
// batch is one EVALSHA of batch.lua: Redis parses one command, enters Lua
// once and reads TIME once for all of its decisions, and the numbers go
// both ways as packed doubles instead of text that go-redis boxes one value
// at a time (Redis's CPU per decision is the largest cost of the allowed
// path on a shared machine, and go-redis's EVALSHA allocates per value).
// Over a Cluster, where one script may only touch one slot, each decision
// is its own EVALSHA of batch.lua, in a pipeline to the lane's master.
// Callers' call records and their wake-up channels are reused
// (sync.Pool); what a decision still allocates here is its bucket key and
// go-redis's boxing of its two keys.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
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
	// Workers is how many batches may be on the wire at once to one
	// server (default: 1 over one server, 4 to each master of a Cluster;
	// see defaultWorkers).
	Workers int
	// MaxBatch is the most decisions in one pipeline (default 256).
	MaxBatch int
	// MinBatch and MaxDelay: a worker holding fewer than MinBatch decisions
	// waits up to MaxDelay for more (default 0: never wait).
	MinBatch int
	MaxDelay time.Duration
	// Queue is the capacity of a lane's queue (default 4096); a full
	// queue makes Take wait (bounded by its context).
	Queue int
	// Timeout bounds one pipeline round trip (default 1s), unless the
	// latest deadline among the batch's callers' contexts is later: a
	// caller that may wait longer (GuardSettings.MaxWait, on a starved
	// process) is not failed by a shorter pipeline deadline. Each caller's
	// own context bounds its wait.
	Timeout time.Duration
}

// Pipelined is an enforcement.Authority that coalesces concurrent
// decisions into pipelines. It is safe for concurrent use.
type Pipelined struct {
	store *Store
	rdb   PipelineClient
	// whole: a batch may be one script call whatever its keys (one
	// server); client is then rdb as a *redis.Client.
	whole  bool
	client *redis.Client
	// cluster is rdb as a *redis.ClusterClient, or nil: then every
	// decision takes lane one.
	cluster *redis.ClusterClient
	// routable: a batch over the Cluster has been answered, so the cluster
	// client holds a slot map and finds a key's master without a network
	// call (it never drops the map once loaded). Until then every decision
	// takes lane one, whose batch loads the map.
	routable atomic.Bool
	cfg      PipelineConfig
	one      *lane // over one server; over a Cluster, decisions whose master is unknown

	mu     sync.Mutex
	closed bool                             // Close has begun: no new lane
	lanes  atomic.Pointer[map[string]*lane] // by master's address; copied on write

	stop      chan struct{}
	stopOnce  sync.Once
	drained   chan struct{} // closed when Close has answered the queues
	drainOnce sync.Once
	wg        sync.WaitGroup
}

// lane is one queue and the workers that send its batches.
type lane struct {
	queue chan *call
}

var _ enforcement.Authority = (*Pipelined)(nil)

type call struct {
	ctx        context.Context // the caller's: a call it gave up on is not sent
	key, scope string
	lim        enforcement.Limit
	cost       int64
	v          enforcement.Verdict
	err        error
	// done receives one value when v and err are set (buffered: the
	// worker never waits for the caller).
	done chan struct{}
	// bucketKey is set by Take when it chose a Cluster master's lane,
	// else by the worker; quotaKey and quotaEnd by the worker, for its batch.
	bucketKey, quotaKey string
	quotaEnd            int64
	batch               int // decisions in the batch the call rode in
}

// calls recycles call records: a caller that received its answer is the
// last user of its call. One its caller gave up on is left to the GC (the
// worker may still write it).
var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func (c *call) answer(v enforcement.Verdict, err error) {
	c.v, c.err = v, err
	c.done <- struct{}{}
}

// ErrClosed is returned for decisions asked of a closed Pipelined store.
var ErrClosed = errors.New("redisstore: pipelined store closed")

// NewPipelined returns an auto-pipelining authority over rdb with the key
// layout of New(rdb, prefix), and starts its workers (over a Cluster, a
// master's are started with the first decision routed to it).
func NewPipelined(rdb PipelineClient, prefix string, cfg PipelineConfig) *Pipelined {
	client, whole := rdb.(*redis.Client)
	cluster, _ := rdb.(*redis.ClusterClient)
	if cfg.Workers <= 0 {
		cfg.Workers = defaultWorkers(whole)
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4096
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	p := &Pipelined{store: New(rdb, prefix), rdb: rdb, whole: whole, client: client, cluster: cluster, cfg: cfg,
		stop: make(chan struct{}), drained: make(chan struct{})}
	p.lanes.Store(&map[string]*lane{})
	p.one = p.startLane()
	return p
}

// startLane makes a lane and starts its workers. Called from NewPipelined,
// or with p.mu held and p.closed false (so that Close waits for them).
func (p *Pipelined) startLane() *lane {
	l := &lane{queue: make(chan *call, p.cfg.Queue)}
	p.wg.Add(p.cfg.Workers)
	for range p.cfg.Workers {
		go p.work(l)
	}
	return l
}

// laneOf is the lane of the master the cluster client sends bucketKey to
// (p.one when it does not know the slot's master), or nil once Close has
// begun. Called once p.routable: the lookup is then in memory. The lanes grow with the masters ever routed to (a failover or a
// reshard adds one); a lane left without keys costs its idle workers.
func (p *Pipelined) laneOf(ctx context.Context, bucketKey string) *lane {
	node, err := p.cluster.MasterForKey(ctx, bucketKey)
	if err != nil {
		return p.one // the batch will say why
	}
	addr := node.Options().Addr
	if l := (*p.lanes.Load())[addr]; l != nil {
		return l
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	lanes := *p.lanes.Load()
	if l := lanes[addr]; l != nil {
		return l
	}
	next := maps.Clone(lanes)
	next[addr] = p.startLane()
	p.lanes.Store(&next)
	return next[addr]
}

// defaultWorkers is how many batches go on the wire at once by default.
//
// Over one server, one: the next batch leaves when the previous answer is
// back, so it holds everything that arrived meanwhile (go-redis's own
// autopipeliner sends one batch per round trip by default too). Redis runs
// scripts one at a time, so a second batch on the wire would only wait in
// its socket; what it costs is per-batch work on both sides (a write, a
// read, a wake-up of Redis and of the worker, Redis parsing a command and
// entering Lua). So one worker makes larger batches, and both Redis and the
// limiter spend less per decision, without a later answer at a fixed rate
// or on a starved machine (BENCHMARKS.md). What one batch on the wire gives up is overlap: over a link whose round
// trip is long next to Redis's time per batch, a decision may wait up to
// one round trip for the batch ahead of it; and with nothing but decisions
// on the cores (BenchmarkSharedTier, 128 callers in process) four batches
// answer more. Raise Workers there (cmd/limiter:
// LIMITER_STORE_BATCHES_IN_FLIGHT).
//
// Over a Cluster, four to each master (a lane per master, see the design
// note at the top): as many batches on the wire to one master as when four
// workers sent pipelines split over every master, before the lanes; one
// each is not measured there.
func defaultWorkers(whole bool) int {
	if whole {
		return 1
	}
	return 4
}

// HeedsCancel declares that Take returns as soon as its context is done
// (HeedsCancel: the guard then needs no goroutine per call).
func (p *Pipelined) HeedsCancel() {}

// Store is the plain store with the same key layout (BucketKey, Lease, Preload).
func (p *Pipelined) Store() *Store { return p.store }

// Take implements enforcement.Authority.
func (p *Pipelined) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	select {
	case <-p.stop:
		return enforcement.Verdict{}, ErrClosed
	default:
	}
	c := calls.Get().(*call)
	c.ctx, c.key, c.scope, c.lim, c.cost = ctx, key, scope, lim, cost
	l := p.one
	if p.cluster != nil && p.routable.Load() {
		c.bucketKey = p.store.BucketKey(key, scope)
		if l = p.laneOf(ctx, c.bucketKey); l == nil {
			c.recycle()
			return enforcement.Verdict{}, ErrClosed
		}
	}
	select {
	case l.queue <- c:
	case <-p.stop:
		c.recycle()
		return enforcement.Verdict{}, ErrClosed
	case <-ctx.Done():
		c.recycle()
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: queued: %w", p.store.BucketKey(key, scope), ctx.Err())
	}
	select {
	case <-c.done:
		v, err := c.v, c.err
		reportBatch(ctx, c.batch)
		c.recycle()
		return v, err
	case <-p.drained: // enqueued as Close drained the queue
		return enforcement.Verdict{}, ErrClosed
	case <-ctx.Done():
		// The worker still completes the call; its verdict is dropped.
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %w", p.store.BucketKey(key, scope), ctx.Err())
	}
}

// recycle returns a call its caller is done with to the pool.
func (c *call) recycle() {
	done := c.done
	*c = call{done: done}
	calls.Put(c)
}

// Close stops the workers after the pipelines on the wire complete; queued
// decisions get ErrClosed. It is idempotent.
func (p *Pipelined) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.stopOnce.Do(func() { close(p.stop) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, l := range *p.lanes.Load() {
		l.drain()
	}
	p.one.drain()
	p.drainOnce.Do(func() { close(p.drained) })
	return nil
}

// drain answers what is queued with ErrClosed.
func (l *lane) drain() {
	for {
		select {
		case c := <-l.queue:
			c.answer(enforcement.Verdict{}, ErrClosed)
		default:
			return
		}
	}
}

func (p *Pipelined) work(l *lane) {
	defer p.wg.Done()
	batch := make([]*call, 0, p.cfg.MaxBatch)
	var b batchBuf
	for {
		batch = batch[:0]
		select {
		case <-p.stop:
			return
		case c := <-l.queue:
			batch = append(batch, c)
		}
		batch = p.fill(l, batch)
		batch = p.dropAbandoned(batch)
		if len(batch) > 0 {
			p.run(batch, &b)
		}
	}
}

// fill adds what is queued, up to MaxBatch, waiting up to MaxDelay while
// the batch is under MinBatch.
func (p *Pipelined) fill(l *lane, batch []*call) []*call {
	var timer <-chan time.Time
	for len(batch) < p.cfg.MaxBatch {
		select {
		case c := <-l.queue:
			batch = append(batch, c)
			continue
		default:
		}
		if len(batch) >= p.cfg.MinBatch || p.cfg.MaxDelay <= 0 {
			return batch
		}
		if timer == nil {
			timer = time.After(p.cfg.MaxDelay)
		}
		select {
		case c := <-l.queue:
			batch = append(batch, c)
		case <-timer:
			return batch
		case <-p.stop:
			return batch
		}
	}
	return batch
}

// dropAbandoned answers the calls whose caller has gone (it already
// returned; a bucket must not spend a token for nobody) and keeps the rest.
func (p *Pipelined) dropAbandoned(batch []*call) []*call {
	kept := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.answer(enforcement.Verdict{}, err)
			continue
		}
		kept = append(kept, c)
	}
	return kept
}

// batchBuf is one worker's reusable memory for the script calls of a batch.
type batchBuf struct {
	keys  []string
	args  []byte
	cmds  []*redis.Cmd
	spans [][2]int // the calls of each script call: batch[from:to]
	// The whole batch's EVALSHA as go-redis writes it (wholeCmd): its
	// arguments, and the key count they point to.
	cmdArgs []any
	nkeys   int
}

func (p *Pipelined) run(batch []*call, b *batchBuf) {
	deadline := time.Now().Add(p.cfg.Timeout)
	for _, c := range batch {
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	b.pack(p.store, batch)
	b.spans = b.spans[:0]
	if p.whole {
		b.spans = append(b.spans, [2]int{0, len(batch)})
	} else { // one slot per script: one call each
		for i := range batch {
			b.spans = append(b.spans, [2]int{i, i + 1})
		}
	}
	b.cmds = b.cmds[:0]
	p.exec(ctx, b, batch, false)
	// NOSCRIPT (a restarted or failed-over server): load the script and
	// redo the calls it refused, once.
	noscript := false
	for _, cmd := range b.cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			noscript = true
		}
	}
	if noscript {
		if err := p.loadScript(ctx, batch, b); err == nil {
			p.exec(ctx, b, batch, true)
		}
	}
	if p.cluster != nil && !p.routable.Load() {
		for _, cmd := range b.cmds {
			if cmd.Err() == nil {
				p.routable.Store(true)
				break
			}
		}
	}
	for i, sp := range b.spans {
		answer(batch[sp[0]:sp[1]], b.cmds[i])
	}
}

// loadScript loads batch.lua where the calls of b were refused with
// NOSCRIPT: on the one server, or over a Cluster on the masters of those
// calls only (their lane's), since the cluster client's SCRIPT LOAD goes to
// every master and waits for each, a dead one too.
func (p *Pipelined) loadScript(ctx context.Context, batch []*call, b *batchBuf) error {
	if p.cluster == nil {
		return batchScript.Load(ctx, p.rdb).Err()
	}
	var loaded []*redis.Client
	for i, cmd := range b.cmds {
		if !isNoScript(cmd) {
			continue
		}
		node, err := p.cluster.MasterForKey(ctx, batch[b.spans[i][0]].bucketKey)
		if err != nil {
			return err
		}
		if slices.Contains(loaded, node) {
			continue
		}
		if err := batchScript.Load(ctx, node).Err(); err != nil {
			return err
		}
		loaded = append(loaded, node)
	}
	return nil
}

// pack lays out the keys and the packed numbers of every call in the batch.
func (b *batchBuf) pack(s *Store, batch []*call) {
	b.keys, b.args = b.keys[:0], b.args[:0]
	for _, c := range batch {
		if c.bucketKey == "" { // else Take has set it
			c.bucketKey = s.BucketKey(c.key, c.scope)
		}
		c.quotaKey, c.quotaEnd = s.quotaOf(c.bucketKey, c.key, c.lim)
		c.batch = len(batch)
		b.keys = append(b.keys, c.bucketKey, c.quotaKey)
		for _, f := range [6]float64{c.lim.Rate, float64(c.lim.Burst), float64(c.cost), float64(c.lim.QuotaLimit), float64(c.quotaEnd), c.lim.SoftLimitPercent} {
			b.args = binary.LittleEndian.AppendUint64(b.args, math.Float64bits(f))
		}
	}
}

// exec sends the script calls of b.spans (retry: only those refused with
// NOSCRIPT, after a reload; the others' decisions are made): one EVALSHA
// straight on the client when there is one call, else a pipeline.
func (p *Pipelined) exec(ctx context.Context, b *batchBuf, batch []*call, retry bool) {
	first := !retry
	cmdOf := func(s redis.Scripter, sp [2]int) *redis.Cmd {
		return batchScript.EvalSha(ctx, s, b.keys[2*sp[0]:2*sp[1]], b.args[48*sp[0]:48*sp[1]])
	}
	if len(b.spans) == 1 {
		if first || isNoScript(b.cmds[0]) {
			var cmd *redis.Cmd
			if p.whole {
				cmd = p.wholeCmd(ctx, b, batch)
			} else {
				cmd = cmdOf(p.rdb, b.spans[0])
			}
			if first {
				b.cmds = append(b.cmds, cmd)
			} else {
				b.cmds[0] = cmd
			}
		}
		return
	}
	pipe := p.rdb.Pipeline()
	for i, sp := range b.spans {
		switch {
		case first:
			b.cmds = append(b.cmds, cmdOf(pipe, sp))
		case isNoScript(b.cmds[i]):
			b.cmds[i] = cmdOf(pipe, sp)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
}

// wholeCmd sends the whole batch as one EVALSHA of batch.lua on the one
// server, below go-redis's Script.EvalSha: the argument list is the
// worker's, reused, and the keys go in as pointers to the call records'
// strings (go-redis writes a *string as the string), so that boxing them
// allocates nothing (EvalSha boxes every key and builds a new list per
// batch).
func (p *Pipelined) wholeCmd(ctx context.Context, b *batchBuf, batch []*call) *redis.Cmd {
	b.nkeys = 2 * len(batch)
	args := append(b.cmdArgs[:0], "evalsha", batchHash, &b.nkeys)
	for _, c := range batch {
		args = append(args, &c.bucketKey, &c.quotaKey) // boxed pointers: no allocation
	}
	args = append(args, b.args)
	b.cmdArgs = args
	cmd := redis.NewCmd(ctx, args...)
	_ = p.client.Process(ctx, cmd) // the error is the command's
	return cmd
}

// batchHash is batch.lua's SHA1, boxed once.
var batchHash any = batchScript.Hash()

func isNoScript(cmd *redis.Cmd) bool {
	err := cmd.Err()
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// answer reads one batch.lua reply and answers its calls.
func answer(calls []*call, cmd *redis.Cmd) {
	fail := func(err error) {
		for _, c := range calls {
			c.answer(enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %w", c.bucketKey, err))
		}
	}
	reply, err := cmd.Slice()
	if err != nil {
		fail(err)
		return
	}
	packed, ok := "", len(reply)%2 == 1
	if ok {
		packed, ok = reply[0].(string)
	}
	if !ok || len(packed) != 64*len(calls) {
		fail(fmt.Errorf("%w: %d values", errBadReply, len(reply)))
		return
	}
	// Decisions whose Redis call failed, listed after the packed results.
	var failed map[int64]string
	for i := 1; i+1 < len(reply); i += 2 {
		n, _ := reply[i].(int64)
		msg, _ := reply[i+1].(string)
		if failed == nil {
			failed = make(map[int64]string)
		}
		failed[n] = msg
	}
	for i, c := range calls {
		if msg, bad := failed[int64(i+1)]; bad {
			c.answer(enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %s", c.bucketKey, msg))
			continue
		}
		var res [8]int64
		for j := range res {
			res[j] = int64(math.Float64frombits(le64(packed[64*i+8*j:])))
		}
		c.answer(verdictOf(c.bucketKey, res[:], nil))
	}
}

// le64 is the little-endian uint64 at the start of s.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// BucketScriptSource is the Lua source of the bucket script, for tools that
// load it themselves (redis-benchmark comparisons).
func BucketScriptSource() string { return stateLua + decideLua + bucketLua }
