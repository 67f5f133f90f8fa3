// Package kafkaemit publishes decision events to Kafka without ever making
// a decision wait.
//
// # Design
//
// Emit copies the event into a bounded channel and returns: a non-blocking
// send, no encoding, no I/O, no lock. When the channel is full (Kafka slow
// or down) the event is dropped and counted, and a log line says so at most
// every 10 s. One goroutine owned by the Emitter drains the channel into
// batches (BatchSize messages, or whatever arrived within BatchWait of the
// first), encodes them with metering.Event.AppendEncode into one reused
// buffer, and writes each batch with segmentio/kafka-go (message key = the
// rate-limit key, hashed to a partition, acks from all in-sync replicas). A
// batch that cannot be written within WriteTimeout is dropped and counted.
// A single writer keeps one key's events in decision order.
//
// New starts nothing; Run is the writer. When Run's context ends it stops
// accepting events, writes what is buffered, and gives up (counting the
// rest as dropped) FlushTimeout later.
package kafkaemit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/ratewarden/ratewarden/metering"
)

// Config configures an Emitter. Zero values take the documented defaults.
type Config struct {
	Brokers []string // required, host:port
	Topic   string   // required

	Buffer       int           // events held while Kafka is slow, default 65,536 (about 20 MB)
	BatchSize    int           // messages per write, default 5,000
	BatchWait    time.Duration // longest an event waits for its batch to fill, default 20 ms
	WriteTimeout time.Duration // one batch write including retries, default 5 s
	// FlushTimeout bounds the writes left when Run's context ends (the
	// one in flight and the buffered events), default 5 s.
	FlushTimeout time.Duration

	// TLS and SASL say how to reach the brokers (internal/kafkaconn builds
	// them from the environment); nil = plaintext, no authentication.
	TLS  *tls.Config
	SASL sasl.Mechanism

	Logger   *slog.Logger          // required
	Registry prometheus.Registerer // required; metrics are registered here
}

// Drop reasons, the values of the "reason" label.
const (
	ReasonBufferFull = "buffer_full" // Emit found the buffer full
	ReasonKafka      = "kafka_error" // the batch could not be written
	ReasonClosed     = "closed"      // Emit after Run ended, or left over when its flush gave up
)

// Emitter publishes events. Emit is safe for concurrent use and never
// blocks; it buffers from New on, and Run (called once) writes.
type Emitter struct {
	cfg Config
	log *slog.Logger
	ch  chan metering.Event
	w   *kafka.Writer

	closing atomic.Bool // Run's context has ended: Emit drops

	dropped      atomic.Uint64
	sent         atomic.Uint64
	lastDropLog  atomic.Int64 // unix nanos
	droppedAtLog atomic.Uint64

	mDropped *prometheus.CounterVec
	dropBy   map[string]prometheus.Counter // mDropped by reason, resolved once
	mSent    prometheus.Counter
	mBatch   prometheus.Histogram
	mWrite   prometheus.Histogram
}

// New validates cfg and registers the metrics. It starts nothing and does
// not contact Kafka: a broker that is down at start only causes drops,
// never an error.
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
	e := &Emitter{
		cfg: cfg,
		log: cfg.Logger,
		ch:  make(chan metering.Event, cfg.Buffer),
		w: &kafka.Writer{
			Addr:     kafka.TCP(cfg.Brokers...),
			Topic:    cfg.Topic,
			Balancer: &kafka.Hash{}, // same key → same partition, deterministically
			Transport: &kafka.Transport{
				DialTimeout: 5 * time.Second,
				ClientID:    "limiter",
				TLS:         cfg.TLS,
				SASL:        cfg.SASL,
			},
			// The loop hands over whole batches; the writer must not wait
			// for more.
			BatchSize:       cfg.BatchSize,
			BatchBytes:      1 << 20, // Kafka's default max.message.bytes
			BatchTimeout:    time.Millisecond,
			RequiredAcks:    kafka.RequireAll,
			MaxAttempts:     3,
			WriteBackoffMin: 50 * time.Millisecond,
			WriteBackoffMax: 500 * time.Millisecond,
			ReadTimeout:     cfg.WriteTimeout,
			WriteTimeout:    cfg.WriteTimeout,
		},
		mDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metering_emitter_events_dropped_total",
			Help: "Decision events not published, by reason (buffer_full, kafka_error, closed).",
		}, []string{"reason"}),
		mSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metering_emitter_events_sent_total",
			Help: "Decision events acknowledged by Kafka.",
		}),
		mBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "metering_emitter_batch_messages", Help: "Messages per Kafka write.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		mWrite: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "metering_emitter_write_duration_seconds", Help: "Duration of one batch write to Kafka.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	buffered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metering_emitter_buffer_events", Help: "Events waiting in the emitter's buffer.",
	}, func() float64 { return float64(len(e.ch)) })
	capacity := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "metering_emitter_buffer_capacity", Help: "Capacity of the emitter's buffer, in events.",
	})
	capacity.Set(float64(cfg.Buffer))
	for _, c := range []prometheus.Collector{e.mDropped, e.mSent, e.mBatch, e.mWrite, buffered, capacity} {
		if err := cfg.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("kafkaemit: metrics: %w", err)
		}
	}
	e.dropBy = map[string]prometheus.Counter{}
	for _, r := range []string{ReasonBufferFull, ReasonKafka, ReasonClosed} {
		e.dropBy[r] = e.mDropped.WithLabelValues(r)
	}
	return e, nil
}

// Emit queues ev for publication and returns at once. When the buffer is
// full, or once Run's context has ended, ev is dropped and counted.
func (e *Emitter) Emit(ev metering.Event) {
	if e.closing.Load() {
		e.drop(ReasonClosed, 1)
		return
	}
	select {
	case e.ch <- ev:
	default:
		e.drop(ReasonBufferFull, 1)
	}
}

// Dropped is the number of events dropped so far, for every reason.
func (e *Emitter) Dropped() uint64 { return e.dropped.Load() }

// Sent is the number of events Kafka acknowledged so far.
func (e *Emitter) Sent() uint64 { return e.sent.Load() }

func (e *Emitter) drop(reason string, n int) {
	total := e.dropped.Add(uint64(n))
	e.dropBy[reason].Add(float64(n))
	now := time.Now().UnixNano()
	last := e.lastDropLog.Load()
	if now-last >= int64(10*time.Second) && e.lastDropLog.CompareAndSwap(last, now) {
		since := total - e.droppedAtLog.Swap(total)
		e.log.Warn("dropping decision events: Kafka is slow or unreachable, or the emitter is closed",
			"reason", reason, "dropped_since_last_log", since, "dropped_total", total, "buffer", e.cfg.Buffer)
	}
}

// batch is the loop's batch under construction: keys and encoded values
// in one reused arena.
type batch struct {
	arena []byte
	spans [][4]int // key start/end, value start/end in arena
	msgs  []kafka.Message
}

func (b *batch) add(ev *metering.Event) {
	ks := len(b.arena)
	b.arena = append(b.arena, ev.Key...)
	vs := len(b.arena)
	b.arena = ev.AppendEncode(b.arena)
	b.spans = append(b.spans, [4]int{ks, vs, vs, len(b.arena)})
}

func (b *batch) len() int { return len(b.spans) }

// abandon gives the batch a new arena after a write that failed. kafka-go
// returns from a write that timed out while its transport may still be
// encoding the request, and may still send it, from the old arena: reusing
// it would put the next batch's events into that request, under the old
// messages' partitions (events in the wrong partition, and the same event id
// in two partitions, which no per-partition deduplication can catch).
func (b *batch) abandon() {
	b.arena = make([]byte, 0, cap(b.arena))
	b.msgs = make([]kafka.Message, 0, cap(b.msgs))
}

// take returns the batch's messages (valid until the next add) and empties it.
func (b *batch) take() []kafka.Message {
	// The arena may have moved while growing: slice it only now.
	b.msgs = b.msgs[:0]
	for _, s := range b.spans {
		b.msgs = append(b.msgs, kafka.Message{Key: b.arena[s[0]:s[1]:s[1]], Value: b.arena[s[2]:s[3]:s[3]]})
	}
	b.spans, b.arena = b.spans[:0], b.arena[:0]
	return b.msgs
}

// Run writes batches until ctx ends, then stops accepting events, writes
// what is buffered and closes the writer, all within FlushTimeout of ctx's
// end (what is left then is dropped and counted), and returns. The error
// says that the flush was cut short, or that closing the writer failed.
// Run must be called once.
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
	e.loop(ctx, wctx)
	if !stopAfter() {
		<-ended // the callback has started: let it finish before Run returns
	}

	var err error
	if wctx.Err() != nil {
		err = fmt.Errorf("kafkaemit: flush cut short after %s: the rest was dropped", e.cfg.FlushTimeout)
	}
	e.closing.Store(true)
	if cerr := e.w.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("kafkaemit: close writer: %w", cerr)
	}
	if tr, ok := e.w.Transport.(*kafka.Transport); ok {
		tr.CloseIdleConnections()
	}
	// An Emit that raced with the end may have slipped in after the drain.
	n := len(e.ch)
	for i := 0; i < n; i++ {
		<-e.ch
	}
	if n > 0 {
		e.drop(ReasonClosed, n)
	}
	return err
}

// loop is the single writer: until ctx ends, then the drain. Writes run
// under wctx.
func (e *Emitter) loop(ctx, wctx context.Context) {
	b := &batch{
		arena: make([]byte, 0, e.cfg.BatchSize*300),
		spans: make([][4]int, 0, e.cfg.BatchSize),
		msgs:  make([]kafka.Message, 0, e.cfg.BatchSize),
	}
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
		timer.Reset(e.cfg.BatchWait)
	fill:
		for b.len() < e.cfg.BatchSize {
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
		if !e.write(wctx, b.take()) {
			b.abandon()
		}
	}
}

// drain writes everything still buffered, until wctx ends.
func (e *Emitter) drain(wctx context.Context, b *batch) {
	for {
		if wctx.Err() != nil {
			n := b.len() + len(e.ch)
			b.take()
			for len(e.ch) > 0 {
				<-e.ch
			}
			e.drop(ReasonClosed, n)
			return
		}
		select {
		case ev := <-e.ch:
			b.add(&ev)
			if b.len() >= e.cfg.BatchSize && !e.write(wctx, b.take()) {
				b.abandon()
			}
		default:
			if b.len() > 0 && !e.write(wctx, b.take()) {
				b.abandon()
			}
			return
		}
	}
}

// write writes one batch and reports whether Kafka acknowledged all of it.
func (e *Emitter) write(wctx context.Context, msgs []kafka.Message) bool {
	ctx, cancel := context.WithTimeout(wctx, e.cfg.WriteTimeout)
	defer cancel()
	start := time.Now()
	err := e.w.WriteMessages(ctx, msgs...)
	e.mWrite.Observe(time.Since(start).Seconds())
	e.mBatch.Observe(float64(len(msgs)))
	if err == nil {
		e.sent.Add(uint64(len(msgs)))
		e.mSent.Add(float64(len(msgs)))
		return true
	}
	// Partial failures: kafka.WriteErrors says which messages failed.
	failed := len(msgs)
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) {
		failed = werrs.Count()
	}
	if ok := len(msgs) - failed; ok > 0 {
		e.sent.Add(uint64(ok))
		e.mSent.Add(float64(ok))
	}
	e.drop(ReasonKafka, failed)
	e.log.Debug("kafka write failed", "messages", len(msgs), "failed", failed, "err", err)
	return false
}
