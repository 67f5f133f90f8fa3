package redisstore

// Design: auto-pipelining. Take puts the decision on a queue and waits;
// Workers goroutines each take what is queued (up to MaxBatch, waiting at
// most MaxDelay for more when fewer than MinBatch are there) and send it
// as one pipeline of EVALSHA calls, then hand each caller its verdict. While
// one pipeline is on the wire the queue fills, so under load batches grow by
// themselves and Redis sees few, large writes; a lone decision goes out at
// once (MaxDelay 0 by default). The scripts are the same as Store's, so
// decisions are identical; only the transport differs. The workers are
// owned by the Pipelined store: Close stops them.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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
	// Workers is how many pipelines may be on the wire at once (default 4).
	Workers int
	// MaxBatch is the most decisions in one pipeline (default 256).
	MaxBatch int
	// MinBatch and MaxDelay: a worker holding fewer than MinBatch decisions
	// waits up to MaxDelay for more (default 0: never wait).
	MinBatch int
	MaxDelay time.Duration
	// Queue is the queue's capacity (default 4096); a full queue makes
	// Take wait (bounded by its context).
	Queue int
	// Timeout bounds one pipeline round trip (default 1s), unless the
	// latest deadline among the batch's callers' contexts is later: a
	// caller that may wait longer (guard.Settings.MaxWait, on a starved
	// process) is not failed by a shorter pipeline deadline. Each caller's
	// own context bounds its wait.
	Timeout time.Duration
}

// Pipelined is an enforcement.Authority that coalesces concurrent
// decisions into pipelines. It is safe for concurrent use.
type Pipelined struct {
	store *Store
	rdb   PipelineClient
	cfg   PipelineConfig
	queue chan *call

	stop      chan struct{}
	stopOnce  sync.Once
	drained   chan struct{} // closed when Close has answered the queue
	drainOnce sync.Once
	wg        sync.WaitGroup
}

var _ enforcement.Authority = (*Pipelined)(nil)

type call struct {
	ctx        context.Context // the caller's: a call it gave up on is not sent
	key, scope string
	lim        enforcement.Limit
	cost       int64
	v          enforcement.Verdict
	err        error
	done       chan struct{}
}

// ErrClosed is returned for decisions asked of a closed Pipelined store.
var ErrClosed = errors.New("redisstore: pipelined store closed")

// NewPipelined returns an auto-pipelining authority over rdb with the key
// layout of New(rdb, prefix), and starts its workers.
func NewPipelined(rdb PipelineClient, prefix string, cfg PipelineConfig) *Pipelined {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
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
	p := &Pipelined{store: New(rdb, prefix), rdb: rdb, cfg: cfg,
		queue: make(chan *call, cfg.Queue), stop: make(chan struct{}), drained: make(chan struct{})}
	p.wg.Add(cfg.Workers)
	for range cfg.Workers {
		go p.work()
	}
	return p
}

// HeedsCancel declares that Take returns as soon as its context is done
// (guard.HeedsCancel: the guard then needs no goroutine per call).
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
	c := &call{ctx: ctx, key: key, scope: scope, lim: lim, cost: cost, done: make(chan struct{})}
	select {
	case p.queue <- c:
	case <-p.stop:
		return enforcement.Verdict{}, ErrClosed
	case <-ctx.Done():
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: queued: %w", p.store.BucketKey(key, scope), ctx.Err())
	}
	select {
	case <-c.done:
		return c.v, c.err
	case <-p.drained: // enqueued as Close drained the queue
		return enforcement.Verdict{}, ErrClosed
	case <-ctx.Done():
		// The worker still completes the call; its verdict is dropped.
		return enforcement.Verdict{}, fmt.Errorf("redis bucket script for %q: %w", p.store.BucketKey(key, scope), ctx.Err())
	}
}

// Close stops the workers after the pipelines on the wire complete; queued
// decisions get ErrClosed. It is idempotent.
func (p *Pipelined) Close(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		select {
		case c := <-p.queue:
			c.err = ErrClosed
			close(c.done)
		default:
			p.drainOnce.Do(func() { close(p.drained) })
			return nil
		}
	}
}

func (p *Pipelined) work() {
	defer p.wg.Done()
	batch := make([]*call, 0, p.cfg.MaxBatch)
	cmds := make([]*redis.Cmd, 0, p.cfg.MaxBatch)
	for {
		batch = batch[:0]
		select {
		case <-p.stop:
			return
		case c := <-p.queue:
			batch = append(batch, c)
		}
		batch = p.fill(batch)
		batch = p.dropAbandoned(batch)
		if len(batch) > 0 {
			cmds = p.run(batch, cmds[:0])
		}
	}
}

// fill adds what is queued, up to MaxBatch, waiting up to MaxDelay while
// the batch is under MinBatch.
func (p *Pipelined) fill(batch []*call) []*call {
	var timer <-chan time.Time
	for len(batch) < p.cfg.MaxBatch {
		select {
		case c := <-p.queue:
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
		case c := <-p.queue:
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
			c.err = err
			close(c.done)
			continue
		}
		kept = append(kept, c)
	}
	return kept
}

func (p *Pipelined) run(batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	deadline := time.Now().Add(p.cfg.Timeout)
	for _, c := range batch {
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmds = p.exec(ctx, batch, cmds)
	// NOSCRIPT (a restarted or failed-over server): load the script and
	// redo the calls it refused, once.
	var retry []*call
	for i, c := range batch {
		if err := cmds[i].Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			retry = append(retry, c)
		}
	}
	if len(retry) > 0 {
		if err := bucketScript.Load(ctx, p.rdb).Err(); err == nil {
			rcmds := p.exec(ctx, retry, nil)
			j := 0
			for i, c := range batch {
				if j < len(retry) && retry[j] == c {
					cmds[i] = rcmds[j]
					j++
				}
			}
		}
	}
	for i, c := range batch {
		c.v, c.err = p.verdict(c, cmds[i])
		close(c.done)
	}
	return cmds
}

func (p *Pipelined) exec(ctx context.Context, batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	pipe := p.rdb.Pipeline()
	for _, c := range batch {
		keys, args := p.store.bucketCall(c.key, c.scope, c.lim, c.cost)
		cmds = append(cmds, bucketScript.EvalSha(ctx, pipe, keys, args...))
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return cmds
}

func (p *Pipelined) verdict(c *call, cmd *redis.Cmd) (enforcement.Verdict, error) {
	res, err := cmd.Int64Slice()
	return verdictOf(p.store.BucketKey(c.key, c.scope), res, err)
}

// BucketScriptSource is the Lua source of the bucket script, for tools that
// load it themselves (redis-benchmark comparisons).
func BucketScriptSource() string { return bucketLua }
