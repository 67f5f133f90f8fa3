// Package kafkaemit publishes decision events to Kafka without ever making
// a decision wait.
//
// # Design
//
// Emit copies the event into a bounded channel and returns: a non-blocking
// send, no encoding, no I/O, no lock. One goroutine owned by the Emitter
// drains the channel into batches (BatchSize messages, or whatever arrived
// within BatchWait of the first one's decision), encodes them with
// metering.Event.AppendEncode into one reused buffer, and writes each batch
// as one record batch per partition built here and sent with kafka-go's
// Client.RawProduce (produce.go; message key = the rate-limit key, hashed
// to a partition, acks from all in-sync replicas). A single writer keeps
// one key's events in decision order while Kafka keeps up.
//
// A write that fails is counted by what is known of it: refused (Kafka
// answered no, or could not be reached: nothing was written) or
// unconfirmed (timed out, or the connection broke after the request went:
// it may have been written, and may still be, late).
//
// Without a spool (Config.Spool nil) the emitter is lossy by design: when
// the channel is full (Kafka slow or down) the event is dropped, a failed
// batch is dropped, each counted by reason, and a log line says so at most
// every 10 s. With a spool (spool.go) nothing is dropped while the spool's
// byte budget lasts: the channel's overflow and every failed batch go to
// disk, and the spool is drained oldest first once Kafka takes writes
// again.
//
// New starts nothing; Run is the writer. When Run's context ends it stops
// accepting events, writes what is buffered, and gives up FlushTimeout
// later: what is left is counted as dropped, or, with a spool, spooled for
// the next start.
package kafkaemit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/spool"
)

// Config configures an Emitter. Zero values take the documented defaults.
type Config struct {
	Brokers []string // required, host:port
	Topic   string   // required

	Buffer       int           // events held while Kafka is slow, default 65,536 (about 20 MB)
	BatchSize    int           // messages per write, default 5,000
	BatchWait    time.Duration // longest a batch waits to fill after its first event's decision time, default 20 ms
	WriteTimeout time.Duration // one batch write including retries, default 5 s
	// FlushTimeout bounds the writes left when Run's context ends (the
	// one in flight and the buffered events), default 5 s.
	FlushTimeout time.Duration
	// Compression is the codec of the record batches (kafka-go's:
	// kafka.Snappy, kafka.Lz4, kafka.Zstd, kafka.Gzip); zero = Lz4, the
	// cheapest per event in CPU on both sides (BENCHMARKS.md, Metering).
	// NoCompression turns it off.
	Compression   kafka.Compression
	NoCompression bool

	// Spool, when set, keeps what Kafka does not take (spool.go); the
	// Emitter owns it from New on and closes it when Run returns. nil =
	// lossy: the overflow and failed batches are dropped and counted.
	Spool *spool.Spool
	// DrainRate is the most spooled events per second the drainer sends,
	// default 10,000: a backlog drains beside fresh traffic without taking
	// the CPU decisions need (on a small machine the unpaced drain took a
	// third of /check's throughput). Negative = unpaced.
	DrainRate float64
	// SpillBuffer is the events held between Emit and the spool's disk
	// writer when the buffer is full, default 16,384; past it the disk is
	// behind and events are dropped (reason spool_behind).
	SpillBuffer int

	// Refusing reports that Kafka refuses this process's connections (a
	// credential, a TLS handshake: the limiter's connection check knows).
	// A broker that refuses a credential closes the connection, which
	// kafka-go reports like any cut connection; while Refusing holds, such
	// a failure counts as refused, not unconfirmed. nil = never.
	Refusing func() bool

	// TLS and SASL say how to reach the brokers (internal/kafkaconn builds
	// them from the environment); nil = plaintext, no authentication.
	TLS  *tls.Config
	SASL sasl.Mechanism

	Logger   *slog.Logger          // required
	Registry prometheus.Registerer // required; metrics are registered here
}

// Drop reasons, the values of the "reason" label of
// metering_emitter_events_dropped_total.
const (
	ReasonBufferFull = "buffer_full" // Emit found the buffer full (no spool)
	// ReasonRefused: Kafka answered the write with an error, or could not
	// be reached; nothing was written (no spool, or a record Kafka will
	// never take, such as one too large).
	ReasonRefused = "refused"
	// ReasonUnconfirmed: the write timed out or its connection broke
	// after the request went: it may have been written (no spool).
	ReasonUnconfirmed = "unconfirmed"
	ReasonClosed      = "closed"       // Emit after Run ended, or left over when its flush gave up (no spool)
	ReasonSpoolFull   = "spool_full"   // the spool's byte budget is spent
	ReasonSpoolBehind = "spool_behind" // the spool's disk writer could not keep up with the overflow
	ReasonSpoolError  = "spool_error"  // the spool's disk refused a write
	// ReasonSpoolCorrupt: a damaged stretch of a segment skipped when the
	// spool was opened (a write torn by a kill, a flipped bit): at least
	// one event each.
	ReasonSpoolCorrupt = "spool_corrupt"
)

var dropReasons = []string{ReasonBufferFull, ReasonRefused, ReasonUnconfirmed, ReasonClosed,
	ReasonSpoolFull, ReasonSpoolBehind, ReasonSpoolError, ReasonSpoolCorrupt}

// Emitter publishes events. Emit is safe for concurrent use and never
// blocks; it buffers from New on, and Run (called once) writes.
type Emitter struct {
	cfg Config
	log *slog.Logger
	ch  chan metering.Event
	tr  *kafka.Transport
	p   *producer

	closing atomic.Bool // Run's context has ended: Emit drops

	dropped      atomic.Uint64
	sent         atomic.Uint64
	lastDropLog  atomic.Int64 // unix nanos
	droppedAtLog atomic.Uint64

	mDropped *prometheus.CounterVec
	dropBy   map[string]prometheus.Counter // mDropped by reason, resolved once
	failBy   map[string]prometheus.Counter // metering_emitter_write_failed_events_total by reason
	mSent    prometheus.Counter
	mBatch   prometheus.Histogram
	mWrite   prometheus.Histogram

	sp *spooler // nil without a spool
}

// New validates cfg and registers the metrics. It starts nothing and does
// not contact Kafka: a broker that is down at start only causes drops (or
// spooling), never an error.
func New(cfg Config) (*Emitter, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	if cfg.Topic == "" {
		errs = append(errs, errors.New("no topic"))
	}
	if cfg.Logger == nil || cfg.Registry == nil {
		errs = append(errs, errors.New("Logger and Registry are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("kafkaemit: %w", err)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 65536
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 5000
	}
	if cfg.BatchWait <= 0 {
		cfg.BatchWait = 20 * time.Millisecond
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.FlushTimeout <= 0 {
		cfg.FlushTimeout = 5 * time.Second
	}
	if cfg.SpillBuffer <= 0 {
		cfg.SpillBuffer = 16384
	}
	if cfg.DrainRate == 0 {
		cfg.DrainRate = 10000
	}
	codec := cfg.Compression
	switch {
	case cfg.NoCompression:
		codec = 0
	case codec == 0:
		codec = kafka.Lz4
	}
	tr := &kafka.Transport{
		DialTimeout:    5 * time.Second,
		ClientID:       "limiter",
		MetadataTopics: []string{cfg.Topic},
		TLS:            cfg.TLS,
		SASL:           cfg.SASL,
	}
	e := &Emitter{
		cfg:      cfg,
		log:      cfg.Logger,
		ch:       make(chan metering.Event, cfg.Buffer),
		tr:       tr,
		p:        newProducer(&kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: tr}, cfg.Topic, codec),
		mDropped: promdecl.CounterVec("metering_emitter_events_dropped_total", "Decision events not published, by reason (buffer_full, refused, unconfirmed, closed, spool_full, spool_behind, spool_error, spool_corrupt).", "reason"),
		mSent:    promdecl.Counter("metering_emitter_events_sent_total", "Decision events acknowledged by Kafka (an event resent from the spool counts each time)."),
		mBatch:   promdecl.Histogram("metering_emitter_batch_messages", "Messages per Kafka write.", prometheus.ExponentialBuckets(1, 4, 8)),
		mWrite:   promdecl.Histogram("metering_emitter_write_duration_seconds", "Duration of one batch write to Kafka.", prometheus.ExponentialBuckets(0.0005, 2, 16)),
	}
	failed := promdecl.CounterVec("metering_emitter_write_failed_events_total", "Events in Kafka writes that failed, by what is known: refused (not written) or unconfirmed (timed out: may have been written). With a spool they are kept and sent again.", "reason")
	buffered := promdecl.GaugeFunc("metering_emitter_buffer_events", "Events waiting in the emitter's buffer.", func() float64 { return float64(len(e.ch)) })
	capacity := promdecl.Gauge("metering_emitter_buffer_capacity", "Capacity of the emitter's buffer, in events.")
	capacity.Set(float64(cfg.Buffer))
	for _, c := range []prometheus.Collector{e.mDropped, failed, e.mSent, e.mBatch, e.mWrite, buffered, capacity} {
		if err := cfg.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("kafkaemit: metrics: %w", err)
		}
	}
	e.dropBy = map[string]prometheus.Counter{}
	for _, r := range dropReasons {
		e.dropBy[r] = e.mDropped.WithLabelValues(r)
	}
	e.failBy = map[string]prometheus.Counter{
		ReasonRefused: failed.WithLabelValues(ReasonRefused), ReasonUnconfirmed: failed.WithLabelValues(ReasonUnconfirmed),
	}
	if cfg.Spool != nil {
		sp, err := newSpooler(e, cfg.Spool, cfg.Registry)
		if err != nil {
			return nil, err
		}
		e.sp = sp
	}
	return e, nil
}

// Emit queues ev for publication and returns at once. When the buffer is
// full it goes to the spool's disk writer instead (dropped and counted
// without a spool, or when that writer is behind too); once Run's context
// has ended, ev is dropped and counted.
func (e *Emitter) Emit(ev metering.Event) {
	if e.closing.Load() {
		e.drop(ReasonClosed, 1)
		return
	}
	select {
	case e.ch <- ev:
		return
	default:
	}
	if e.sp == nil {
		e.drop(ReasonBufferFull, 1)
		return
	}
	select {
	case e.sp.spill <- ev:
	default:
		e.drop(ReasonSpoolBehind, 1)
	}
}

// Dropped is the number of events dropped so far, for every reason.
func (e *Emitter) Dropped() uint64 { return e.dropped.Load() }

// Sent is the number of events Kafka acknowledged so far.
func (e *Emitter) Sent() uint64 { return e.sent.Load() }

func (e *Emitter) drop(reason string, n int) {
	if n == 0 {
		return
	}
	total := e.dropped.Add(uint64(n))
	e.dropBy[reason].Add(float64(n))
	now := time.Now().UnixNano()
	last := e.lastDropLog.Load()
	if now-last >= int64(10*time.Second) && e.lastDropLog.CompareAndSwap(last, now) {
		since := total - e.droppedAtLog.Swap(total)
		e.log.Warn("dropping decision events: Kafka is slow or unreachable, the spool is full, or the emitter is closed",
			"reason", reason, "dropped_since_last_log", since, "dropped_total", total, "buffer", e.cfg.Buffer)
	}
}

func (e *Emitter) sentN(n int) {
	e.sent.Add(uint64(n))
	e.mSent.Add(float64(n))
}

// batch is a batch under construction: keys and encoded values in one
// reused arena, with each event's time (for the spool).
type batch struct {
	arena []byte
	spans [][4]int // key start/end, value start/end in arena
	times []int64
	msgs  []kafka.Message
}

func newBatch(n int) *batch {
	return &batch{arena: make([]byte, 0, n*300), spans: make([][4]int, 0, n), times: make([]int64, 0, n),
		msgs: make([]kafka.Message, 0, n)}
}

func (b *batch) add(ev *metering.Event) {
	ks := len(b.arena)
	b.arena = append(b.arena, ev.Key...)
	vs := len(b.arena)
	b.arena = ev.AppendEncode(b.arena)
	b.spans = append(b.spans, [4]int{ks, vs, vs, len(b.arena)})
	b.times = append(b.times, ev.TS)
}

func (b *batch) len() int { return len(b.spans) }

// take returns the batch's messages and times (valid until the next add)
// and empties it.
func (b *batch) take() ([]kafka.Message, []int64) {
	// The arena may have moved while growing: slice it only now.
	b.msgs = b.msgs[:0]
	for _, s := range b.spans {
		b.msgs = append(b.msgs, kafka.Message{Key: b.arena[s[0]:s[1]:s[1]], Value: b.arena[s[2]:s[3]:s[3]]})
	}
	times := b.times
	b.spans, b.arena, b.times = b.spans[:0], b.arena[:0], b.times[len(b.times):]
	return b.msgs, times
}

// Run writes batches until ctx ends, then stops accepting events, writes
// what is buffered and closes the writer, all within FlushTimeout of ctx's
// end (what is left then is dropped and counted, or spooled), and returns.
// The error says that the flush was cut short, or that closing the writer
// or the spool failed. Run must be called once.
func (e *Emitter) Run(ctx context.Context) error {
	// Writes are not cancelled with ctx: the one in flight when ctx ends
	// completes, then the buffer is written, until abort FlushTimeout later.
	wctx, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	cutoff := time.AfterFunc(time.Hour, abort)
	cutoff.Stop()
	defer cutoff.Stop()
	ended := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(ended)
		e.closing.Store(true)
		cutoff.Reset(e.cfg.FlushTimeout)
	})
	var wg sync.WaitGroup
	if e.sp != nil {
		wg.Add(2)
		go func() { defer wg.Done(); e.sp.diskWriter(ctx) }()
		go func() { defer wg.Done(); e.sp.drainer(ctx, wctx) }()
	}
	e.loop(ctx, wctx)
	wg.Wait()
	if !stopAfter() {
		<-ended // the callback has started: let it finish before Run returns
	}

	var err error
	if wctx.Err() != nil {
		err = fmt.Errorf("kafkaemit: flush cut short after %s: the rest was %s", e.cfg.FlushTimeout,
			map[bool]string{false: "dropped", true: "spooled"}[e.sp != nil])
	}
	e.closing.Store(true)
	e.tr.CloseIdleConnections()
	// An Emit that raced with the end may have slipped in after the drain.
	b := newBatch(0)
	for n := len(e.ch); n > 0; n-- {
		ev := <-e.ch
		b.add(&ev)
	}
	if e.sp != nil {
		for n := len(e.sp.spill); n > 0; n-- {
			ev := <-e.sp.spill
			b.add(&ev)
		}
	}
	e.keep(b, ReasonClosed)
	if e.sp != nil {
		if cerr := e.sp.close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// keep spools what b holds, or without a spool drops it (counted as
// reason), and empties b.
func (e *Emitter) keep(b *batch, reason string) {
	msgs, times := b.take()
	if e.sp == nil {
		e.drop(reason, len(msgs))
		return
	}
	e.sp.append(msgs, times)
}

// loop is the single writer of fresh events: until ctx ends, then the
// drain. Writes run under wctx.
func (e *Emitter) loop(ctx, wctx context.Context) {
	b := newBatch(e.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		// Wait for the first event of a batch.
		select {
		case ev := <-e.ch:
			b.add(&ev)
		case <-ctx.Done():
			e.drain(wctx, b)
			return
		}
		timer.Reset(e.due(b.times[0], time.Now()))
	fill:
		for b.len() < e.cfg.BatchSize {
			// What is queued joins the batch first, even once it is due:
			// a writer that ran late writes one batch, not one per event.
			select {
			case ev := <-e.ch:
				b.add(&ev)
				continue
			default:
			}
			select {
			case ev := <-e.ch:
				b.add(&ev)
			case <-timer.C:
				break fill
			case <-ctx.Done():
				timer.Stop()
				e.drain(wctx, b)
				return
			}
		}
		timer.Stop()
		e.write(wctx, b)
	}
}

// due is how long a batch whose first event was decided at ts (ms since
// the epoch, the limiter's clock) may still wait to fill: BatchWait from
// that decision, not from when the writer took the event. Time the event
// spent in the buffer behind a long write, or while the process waited for
// a CPU, counts against the wait: a killed process loses what is still in
// memory, and the decisions held there are bounded by their age, not by
// the writer's delays. A ts in the future (a clock step) waits BatchWait
// at most; none (0) waits BatchWait.
func (e *Emitter) due(ts int64, now time.Time) time.Duration {
	if ts <= 0 {
		return e.cfg.BatchWait
	}
	return min(e.cfg.BatchWait, max(0, time.UnixMilli(ts).Add(e.cfg.BatchWait).Sub(now)))
}

// drain writes everything still buffered, until wctx ends.
func (e *Emitter) drain(wctx context.Context, b *batch) {
	for {
		if wctx.Err() != nil {
			for len(e.ch) > 0 {
				ev := <-e.ch
				b.add(&ev)
			}
			e.keep(b, ReasonClosed)
			return
		}
		select {
		case ev := <-e.ch:
			b.add(&ev)
			if b.len() >= e.cfg.BatchSize {
				e.write(wctx, b)
			}
		default:
			if b.len() > 0 {
				e.write(wctx, b)
			}
			return
		}
	}
}

// write sends b's events to Kafka (to the spool while the spool is known to
// be waiting for Kafka), and empties b. What fails is spooled, or without a
// spool dropped, and counted by what is known of it.
func (e *Emitter) write(wctx context.Context, b *batch) {
	if e.sp != nil && e.sp.waiting() {
		e.keep(b, "")
		return
	}
	msgs, times := b.take()
	ctx, cancel := context.WithTimeout(wctx, e.cfg.WriteTimeout)
	defer cancel()
	start := time.Now()
	err := e.p.write(ctx, msgs)
	e.mWrite.Observe(time.Since(start).Seconds())
	e.mBatch.Observe(float64(len(msgs)))
	if err == nil {
		e.sentN(len(msgs))
		if e.sp != nil {
			e.sp.kafkaOK()
		}
		return
	}
	failed, why := e.failures(msgs, err)
	if ok := len(msgs) - len(failed); ok > 0 {
		e.sentN(ok)
	}
	e.log.Debug("kafka write failed", "messages", len(msgs), "failed", len(failed), "err", err)
	if e.sp == nil {
		for i := range failed {
			e.drop(why[i], 1)
		}
		return
	}
	e.sp.kafkaFailed()
	keepMsgs := make([]kafka.Message, 0, len(failed))
	keepTimes := make([]int64, 0, len(failed))
	for j, i := range failed {
		if permanent(why[j], msgErr(err, i)) {
			e.drop(ReasonRefused, 1) // Kafka will never take it: sending it again would wedge the spool
			continue
		}
		keepMsgs = append(keepMsgs, msgs[i])
		keepTimes = append(keepTimes, times[i])
	}
	e.sp.append(keepMsgs, keepTimes)
}

// failures returns the indices of msgs a failed write did not deliver, with
// what is known of each (refused or unconfirmed), and counts them.
func (e *Emitter) failures(msgs []kafka.Message, err error) (idx []int, why []string) {
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == len(msgs) {
		for i, we := range werrs {
			if we != nil {
				idx = append(idx, i)
				why = append(why, classify(we))
			}
		}
	} else {
		r := classify(err)
		if r == ReasonUnconfirmed && cutOff(err) && e.cfg.Refusing != nil && e.cfg.Refusing() {
			r = ReasonRefused
		}
		for i := range msgs {
			idx = append(idx, i)
			why = append(why, r)
		}
	}
	for _, r := range why {
		e.failBy[r].Inc()
	}
	return idx, why
}

func msgErr(err error, i int) error {
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && i < len(werrs) {
		return werrs[i]
	}
	return err
}
