// Package consumer reads decision events from Kafka (consumer group "meter")
// and writes them through a sink into ClickHouse with exact totals.
//
// # Design
//
// Kafka decides who owns a partition (the consumer group); ClickHouse
// decides where to start reading it. For each partition of a generation one
// goroutine (started with Generation.Start, so the group waits for it before
// rebalancing):
//
//  1. reads the progress of every table from ClickHouse and starts at the
//     lowest (chsink.Progress.Resume), never at a Kafka committed offset;
//  2. checks that the broker's log is the one that progress belongs to, by
//     the event stored at the last offset, and records a new epoch when the
//     log started over (epoch.go), so a fresh broker or a recreated topic is
//     read from its start with the history kept; then reloads the
//     deduplication window (event ids of the last positions) from
//     decisions_raw;
//  3. reads messages in offset order (fetch.go: its own fetcher, whose
//     round trips have a deadline that allows for a slow broker, never
//     kafka-go's Reader) into a batch cut by size, by time, and at every
//     change of UTC month (chsink.Months: the settles of the month
//     before's reservations, counted in that month, ride along), dropping
//     event ids already seen at an earlier offset (producer retries);
//  4. commits the progress written so far to Kafka, which the group
//     coordinator refuses from a member it no longer counts as the
//     partition's owner (so a member dropped from the group stops writing
//     at its next batch, not at its next heartbeat), then writes the batch
//     (chsink.Sink.Write). The committed offsets are for lag tools and this
//     check only; they are never read back.
//
// Any error (ClickHouse down, a failed INSERT, a broken fetch) throws away
// the goroutine's state and starts again at step 1 after a backoff, so a
// ClickHouse outage, a consumer crash and a rebalance all recover through
// the same path. While a partition is failing the consumer is not ready.
//
// A stall watchdog (watchdog.go) catches what fails without an error: a
// partition with messages to read that writes nothing for StallAfter is
// counted, reported by Ready and given a fresh reader.
package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

// revokeFlush bounds the last batch a partition writes when it is revoked
// (shutdown, rebalance, a watchdog restart).
const revokeFlush = 4 * time.Second

// Sink stores batches and reports progress (implemented by *chsink.Sink).
type Sink interface {
	Progress(ctx context.Context, partition int) (chsink.Progress, error)
	RecentIDs(ctx context.Context, partition int, after int64, fn func(id string, offset, ts int64)) error
	// The long deduplication window (dedup.go): the stored positions of
	// late events' ids, and a bound of the decision times stored below a
	// position.
	LateIDs(ctx context.Context, partition int, late []chsink.Late, fn func(id string, position int64)) error
	NewestBelow(ctx context.Context, partition int, below, fromMs int64) (int64, error)
	Write(ctx context.Context, partition int, recs []chsink.Record, last int64, p *chsink.Progress) error
	// The incarnations of the partition's log (epoch.go).
	Epochs(ctx context.Context, partition int) ([]chsink.Epoch, error)
	AddEpoch(ctx context.Context, partition int, e chsink.Epoch) error
	LastID(ctx context.Context, partition int, from, below int64) (id string, position int64, ok bool, err error)
}

// The decision times the tables can hold (DateTime: 1970 to 2105); events
// outside are counted as bad messages and skipped.
var (
	minTS = time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	maxTS = time.Date(2105, 12, 31, 0, 0, 0, 0, time.UTC).UnixMilli()
)

// Defaults of Config, and of the meter-consumer's METER_BATCH_SIZE,
// METER_BATCH_WAIT, METER_DEDUP_WINDOW and METER_STALL_AFTER.
const (
	DefaultBatchSize   = 50_000
	DefaultBatchWait   = 500 * time.Millisecond
	DefaultDedupWindow = 250_000
	DefaultStallAfter  = 2 * time.Minute
)

// Config configures a Consumer. Zero durations and sizes take the
// documented defaults.
type Config struct {
	Brokers []string // required
	Topic   string   // required
	GroupID string   // default "meter"
	Sink    Sink     // required
	// Ping checks that ClickHouse answers (readiness); required.
	Ping func(ctx context.Context) error

	BatchSize int           // messages per batch, default DefaultBatchSize
	BatchWait time.Duration // longest a message waits in a batch, default DefaultBatchWait
	// DedupWindow is the positions per partition whose event ids are at
	// least held in memory (up to 1.5 times as many), default
	// DefaultDedupWindow, at least 2 × BatchSize. A duplicate further back
	// is found in event_ids (dedup.go).
	DedupWindow    int64
	SessionTimeout time.Duration // consumer-group session, default kafkaconn.GroupSessionTimeout (heartbeats every quarter of it)
	InsertTimeout  time.Duration // one batch write, default 30 s; on shutdown at most 4 s
	// StallAfter is how long a running partition with lag may write nothing
	// before the watchdog counts a stall and restarts its reader; default
	// DefaultStallAfter (well above InsertTimeout: a slow INSERT is not a
	// stall).
	StallAfter time.Duration
	// FetchMaxWait is how long the broker may hold a fetch for data to
	// arrive, default 500 ms; FetchTimeout is the time allowed on top of it
	// for the round trip, default 30 s (Kafka's request.timeout.ms).
	FetchMaxWait time.Duration
	FetchTimeout time.Duration

	// TLS and SASL say how to reach the brokers (internal/kafkaconn builds
	// them from the environment); nil = plaintext, no authentication.
	TLS  *tls.Config
	SASL sasl.Mechanism

	Logger   *slog.Logger          // required
	Registry prometheus.Registerer // required; metrics are registered here
}

// Consumer is the meter consumer. Create it with New, run it with Run.
type Consumer struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	seed maphash.Seed

	pingOK  atomic.Bool
	pingErr atomic.Pointer[string] // why the last ping failed (it names what to fix)
	joined  atomic.Bool            // a member of the group (false while Kafka is unreachable)
	mu      sync.Mutex
	failing map[int]string     // partition → last error
	parts   map[int]*partState // owned partitions, for the stall watchdog
}

// New validates cfg and registers the metrics.
func New(cfg Config) (*Consumer, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("no Kafka brokers"))
	}
	if cfg.Topic == "" {
		errs = append(errs, errors.New("no topic"))
	}
	if cfg.Sink == nil || cfg.Ping == nil || cfg.Logger == nil || cfg.Registry == nil {
		errs = append(errs, errors.New("Sink, Ping, Logger and Registry are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if cfg.GroupID == "" {
		cfg.GroupID = "meter"
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BatchWait <= 0 {
		cfg.BatchWait = DefaultBatchWait
	}
	if cfg.DedupWindow <= 0 {
		cfg.DedupWindow = DefaultDedupWindow
	}
	// A position memory forgets must already be in ClickHouse (dedup.go).
	cfg.DedupWindow = max(cfg.DedupWindow, 2*int64(cfg.BatchSize))
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = kafkaconn.GroupSessionTimeout
	}
	if cfg.InsertTimeout <= 0 {
		cfg.InsertTimeout = 30 * time.Second
	}
	if cfg.StallAfter <= 0 {
		cfg.StallAfter = DefaultStallAfter
	}
	if cfg.FetchMaxWait <= 0 {
		cfg.FetchMaxWait = 500 * time.Millisecond
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 30 * time.Second
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("consumer: metrics: %w", err)
	}
	return &Consumer{cfg: cfg, log: cfg.Logger, m: m, seed: maphash.MakeSeed(), failing: map[int]string{}, parts: map[int]*partState{}}, nil
}

// Ready reports whether the consumer can do its job, and why not.
func (c *Consumer) Ready() (bool, string) {
	if !c.pingOK.Load() {
		if why := c.pingErr.Load(); why != nil {
			return false, "clickhouse unreachable: " + *why
		}
		return false, "clickhouse unreachable"
	}
	if !c.joined.Load() {
		return false, "not a member of consumer group " + c.cfg.GroupID + " (Kafka unreachable or rebalancing)"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	why := map[int]string{}
	for p, e := range c.failing {
		why[p] = e
	}
	for p, s := range c.parts {
		if r := s.stallReason(); r != "" {
			why[p] = r // a stall outranks the error of a restarted attempt
		}
	}
	if len(why) == 0 {
		return true, ""
	}
	var reasons []string
	for _, p := range sortedKeys(why) {
		reasons = append(reasons, fmt.Sprintf("partition %d: %s", p, why[p]))
	}
	return false, strings.Join(reasons, "; ")
}

func (c *Consumer) setFailing(p int, err error) {
	c.mu.Lock()
	c.failing[p] = err.Error()
	c.mu.Unlock()
}

func (c *Consumer) clearFailing(p int) {
	c.mu.Lock()
	delete(c.failing, p)
	c.mu.Unlock()
}

// Run consumes until ctx is cancelled, then flushes what it holds (within
// 4 s), leaves the group and returns nil. It returns an error only when the
// group cannot be created.
func (c *Consumer) Run(ctx context.Context) error {
	gc := kafkaconn.GroupConfig(c.cfg.GroupID, c.cfg.Brokers, c.cfg.Topic,
		&kafka.Dialer{ClientID: "meter-consumer", Timeout: 10 * time.Second, DualStack: true, TLS: c.cfg.TLS, SASLMechanism: c.cfg.SASL},
		c.cfg.SessionTimeout)
	// A member told to rejoin first finishes its partitions' last batches
	// (up to revokeFlush each, in parallel). The coordinator drops a
	// member that has not rejoined within the rebalance timeout and hands
	// its partitions to another while those batches are still being
	// written, which counts them twice; so the timeout leaves room for the
	// flush (it was the session timeout, 2 s in the fault test, and
	// members were dropped mid-flush on a loaded machine).
	gc.RebalanceTimeout = c.cfg.SessionTimeout + 2*revokeFlush + 2*time.Second
	// Partitions added to the topic trigger a rebalance.
	gc.WatchPartitionChanges, gc.PartitionWatchInterval = true, 10*time.Second
	group, err := kafka.NewConsumerGroup(gc)
	if err != nil {
		return fmt.Errorf("consumer: group %s: %w", c.cfg.GroupID, err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.pingLoop(ctx) }()
	go func() { defer wg.Done(); c.watch(ctx) }()

	for {
		gen, err := group.Next(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			c.joined.Store(false)
			c.log.Warn("consumer group: no generation yet", "group", c.cfg.GroupID, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		c.joined.Store(true)
		parts := gen.Assignments[c.cfg.Topic]
		c.m.assigned.Set(float64(len(parts)))
		ids := make([]int, 0, len(parts))
		for _, pa := range parts {
			ids = append(ids, pa.ID)
		}
		c.log.Info("consumer group generation", "generation", gen.ID, "member", gen.MemberID, "partitions", ids)
		for _, pa := range parts {
			p := pa.ID
			gen.Start(func(gctx context.Context) { c.runPartition(ctx, gctx, gen, p) })
		}
	}
	// Close ends the current generation: it waits for the partition
	// goroutines (which flush on ctx) and leaves the group.
	if err := group.Close(); err != nil {
		c.log.Warn("leave consumer group", "err", err)
	}
	wg.Wait()
	return nil
}

// pingLoop pings ClickHouse at once, then every second, until ctx ends.
func (c *Consumer) pingLoop(ctx context.Context) {
	c.ping(ctx)
	lifecycle.Every(ctx, time.Second, c.ping)
}

func (c *Consumer) ping(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := c.cfg.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	was := c.pingOK.Swap(err == nil)
	if err == nil {
		c.m.chUp.Set(1)
		if !was {
			c.log.Info("clickhouse reachable")
		}
		return
	}
	c.m.chUp.Set(0)
	why, prev := err.Error(), c.pingErr.Swap(nil)
	c.pingErr.Store(&why)
	// Logged when it starts failing, and at start (a refused login is an
	// error from the first ping on).
	if was || prev == nil {
		c.log.Warn("clickhouse unreachable", "err", err)
	}
}

// runPartition owns partition p for one generation: it consumes, and after
// any error, or when the stall watchdog ends a stalled attempt, starts again
// from the progress stored in ClickHouse.
func (c *Consumer) runPartition(runCtx, genCtx context.Context, gen *kafka.Generation, p int) {
	ctx, cancel := context.WithCancel(runCtx)
	defer cancel()
	go func() {
		select {
		case <-genCtx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	label := strconv.Itoa(p)
	// A counter that exists from the start (at 0) lets increase() see the
	// first stall; it is kept when the partition moves elsewhere.
	c.m.stalls.WithLabelValues(label).Add(0)
	c.m.gaps.WithLabelValues(label).Add(0)
	for _, r := range []chsink.EpochReason{chsink.Restarted, chsink.Replaced, chsink.Truncated} {
		c.m.epochs.WithLabelValues(label, string(r)).Add(0)
	}
	st := &partState{}
	c.mu.Lock()
	c.parts[p] = st
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.parts[p] == st {
			delete(c.parts, p)
		}
		c.mu.Unlock()
	}()
	defer c.clearFailing(p)
	defer c.m.lag.DeleteLabelValues(label)
	backoff := 200 * time.Millisecond
	for {
		actx, restart := context.WithCancel(ctx)
		err := c.consume(actx, restart, gen, p, st)
		restarted := actx.Err() != nil && ctx.Err() == nil // by the watchdog
		restart()
		st.stop()
		if ctx.Err() != nil {
			return
		}
		if restarted {
			// A fresh reader at once: the stall was counted and logged.
			c.log.Info("partition reader restarted by the stall watchdog", "partition", p)
			continue
		}
		c.setFailing(p, err)
		c.m.restarts.Inc()
		c.log.Warn("partition paused; will resume from ClickHouse progress", "partition", p, "err", err, "backoff", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// consume runs steps 1–4 of the package comment until ctx ends (nil after a
// final flush) or something fails (the error). restart ends ctx (the stall
// watchdog's way to give the partition a fresh reader).
func (c *Consumer) consume(ctx context.Context, restart context.CancelFunc, gen *kafka.Generation, p int, st *partState) error {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	prog, err := c.cfg.Sink.Progress(lctx, p)
	cancel()
	if err != nil {
		return err
	}
	resume := prog.Resume()
	// Messages up to the highest table progress were seen by an earlier
	// run: do not count their duplicates and bad messages again.
	seenUpTo := prog[0]
	for _, v := range prog[1:] {
		seenUpTo = max(seenUpTo, v)
	}
	lctx, cancel = context.WithTimeout(ctx, c.cfg.InsertTimeout)
	eps, err := c.cfg.Sink.Epochs(lctx, p)
	cancel()
	if err != nil {
		return err
	}
	// Which log, and where in it (epoch.go). Offsets in the tables, the
	// batches and the deduplication window are positions (chsink/epochs.go);
	// the fetcher, the committed offsets and the watchdog speak Kafka offsets
	// of epoch ep.
	ep, offset, err := c.locate(ctx, gen, p, eps, resume, seenUpTo)
	if err != nil {
		return err
	}
	dd := newDedup(c.seed, c.cfg.DedupWindow)
	loadFrom := resume - c.cfg.DedupWindow
	lctx, cancel = context.WithTimeout(ctx, c.cfg.InsertTimeout)
	err = c.cfg.Sink.RecentIDs(lctx, p, loadFrom-1, func(id string, off, ts int64) { dd.add(id, off, ts) })
	cancel()
	if err != nil {
		return err
	}
	// What lies below the loaded positions is not in memory: bound its
	// decision times, reading event_ids from a minute before the newest
	// loaded event on (an older event there only makes more messages late,
	// which costs a lookup, never a wrong verdict).
	lctx, cancel = context.WithTimeout(ctx, c.cfg.InsertTimeout)
	older, err := c.cfg.Sink.NewestBelow(lctx, p, loadFrom, max(dd.newest()-60_000, 0))
	cancel()
	if err != nil {
		return err
	}
	dd.bound(older)
	c.clearFailing(p)
	c.log.Debug("partition resumed", "partition", p, "offset", offset, "epoch", ep.Epoch, "position", ep.Position(offset), "progress", prog[:])
	st.start(offset, restart)

	f := startFetcher(ctx, c, p, offset)
	defer f.stop()

	var (
		dec        metering.Decoder
		batch      = make([]chsink.Record, 0, min(c.cfg.BatchSize, 65536))
		n          int                   // messages in the batch, duplicates and bad ones included
		last       int64                 // position of the batch's last message
		written    = ep.Position(offset) // every position below is in ClickHouse
		month      chsink.Months
		lastCommit time.Time
		lagLabel   = strconv.Itoa(p)
		timer      = time.NewTimer(time.Hour)
		due        <-chan time.Time // fires when the batch's first message has waited BatchWait; nil while empty
		dups, bad  int              // in the batch, counted when it is written
		lateAt     []int            // indexes in batch of the late events (dedup.go)
	)
	timer.Stop()
	defer timer.Stop()
	flush := func(budget time.Duration) error {
		timer.Stop()
		due = nil
		if n == 0 {
			return nil
		}
		if len(lateAt) > 0 {
			kept, found, err := c.resolveLate(ctx, p, batch, lateAt, seenUpTo)
			if err != nil {
				return err
			}
			batch, lateAt = kept, lateAt[:0]
			dups += found
		}
		// Only the partition's owner may write. A member the coordinator
		// dropped (its heartbeats late on a loaded machine) learns it at its
		// next heartbeat, while the new owner already writes from the
		// progress it read: both would count the same batches. Committing
		// the progress so far first asks the coordinator, which refuses a
		// member or generation that is no longer current.
		if err := gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: {p: ep.Offset(written)}}); err != nil {
			if errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.RebalanceInProgress) {
				return fmt.Errorf("partition %d: offsets %d–%d not written: this member no longer owns the partition (%w)", p, ep.Offset(written), ep.Offset(last), err)
			}
			return fmt.Errorf("partition %d: offsets %d–%d not written: the group coordinator did not confirm that this member owns the partition: %w", p, ep.Offset(written), ep.Offset(last), err)
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
		defer cancel()
		if err := c.cfg.Sink.Write(wctx, p, batch, last, &prog); err != nil {
			return err
		}
		written = last + 1
		now := time.Now()
		c.m.batchEvents.Observe(float64(n))
		c.m.duplicates.Add(float64(dups))
		c.m.bad.Add(float64(bad))
		dups, bad = 0, 0
		c.m.written.Add(float64(len(batch)))
		nowMs := now.UnixMilli()
		for i := range batch {
			c.m.delay.Observe(float64(nowMs-batch[i].Event.TS) / 1000)
		}
		if st.progress(ep.Offset(last + 1)) {
			c.log.Info("partition makes progress again after a stall", "partition", p, "offset", ep.Offset(last+1))
		}
		if now.Sub(lastCommit) >= time.Second {
			// For lag tools only; the resume point is ClickHouse's.
			if err := gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: {p: ep.Offset(last + 1)}}); err != nil {
				c.log.Debug("commit offset (informational)", "partition", p, "err", err)
			}
			lastCommit = now
		}
		batch, n = batch[:0], 0
		return nil
	}

	for {
		var res fetchResult
		select {
		case <-ctx.Done():
			// Shutdown, rebalance or a watchdog restart: the group waits for
			// this goroutine, so nobody else reads p until the flush is done.
			return flush(min(c.cfg.InsertTimeout, revokeFlush))
		case <-due:
			if err := flush(c.cfg.InsertTimeout); err != nil {
				return err
			}
			continue
		case res = <-f.out:
		}
		if res.err != nil {
			return res.err
		}
		st.seen(res.hwm)
		c.m.lag.WithLabelValues(lagLabel).Set(float64(max(res.hwm-res.next, 0)))
		for _, msg := range res.msgs {
			pos := ep.Position(msg.offset)
			ev, err := dec.DecodeString(msg.value)
			if err == nil && (ev.TS < minTS || ev.TS > maxTS || ev.ReservedTS != 0 && (ev.ReservedTS < minTS || ev.ReservedTS > maxTS)) {
				// DateTime cannot hold it (a settle's cost is counted at
				// its reserved_ts): one such event would fail every INSERT
				// of its batch forever.
				err = fmt.Errorf("%w: ts %d or reserved_ts %d out of range", metering.ErrBadEvent, ev.TS, ev.ReservedTS)
			}
			fresh := pos > seenUpTo
			if err != nil {
				if fresh {
					bad++
				}
				c.log.Debug("skipping undecodable message", "partition", p, "offset", msg.offset, "err", err)
			} else {
				mo := chsink.MonthsOf(&ev)
				joined, ok := month.Join(mo)
				if len(batch) > 0 && !ok {
					if err := flush(c.cfg.InsertTimeout); err != nil {
						return err
					}
				}
				switch dd.add(ev.EventID, pos, ev.TS) {
				case duplicate:
					if fresh {
						dups++
					}
				case late:
					lateAt = append(lateAt, len(batch))
					fallthrough
				default:
					if len(batch) == 0 {
						month = mo
					} else {
						month = joined
					}
					batch = append(batch, chsink.Record{Offset: pos, Event: ev})
				}
			}
			if n == 0 {
				timer.Reset(c.cfg.BatchWait)
				due = timer.C
			}
			n++
			last = pos
			if n >= c.cfg.BatchSize {
				if err := flush(c.cfg.InsertTimeout); err != nil {
					return err
				}
			}
		}
	}
}

// resolveLate looks the late events of batch (at the indexes lateAt) up in
// event_ids and returns batch without those stored at an earlier position
// (filtered in place), and how many of them are beyond seenUpTo (not
// counted as duplicates by an earlier run).
func (c *Consumer) resolveLate(ctx context.Context, p int, batch []chsink.Record, lateAt []int, seenUpTo int64) ([]chsink.Record, int, error) {
	late := make([]chsink.Late, len(lateAt))
	at := make(map[string]int64, len(lateAt)) // id → its position in this batch
	for i, j := range lateAt {
		late[i] = chsink.Late{ID: batch[j].Event.EventID, TS: batch[j].Event.TS}
		at[late[i].ID] = batch[j].Offset
	}
	c.m.lookups.Add(float64(len(late)))
	drop := map[int64]bool{}
	lctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	err := c.cfg.Sink.LateIDs(lctx, p, late, func(id string, stored int64) {
		// Stored at its own position: this message, written by an
		// earlier run. Stored later: an earlier run kept a later copy;
		// this one is the first and stays.
		if pos, ok := at[id]; ok && stored < pos {
			drop[pos] = true
		}
	})
	cancel()
	if err != nil {
		return batch, 0, err
	}
	if len(drop) == 0 {
		return batch, 0, nil
	}
	kept, found := batch[:0], 0
	for _, r := range batch {
		if drop[r.Offset] {
			if r.Offset > seenUpTo {
				found++
			}
			continue
		}
		kept = append(kept, r)
	}
	return kept, found, nil
}
