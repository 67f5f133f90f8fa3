package kafkaemit

// # The spool
//
// With a spool, three goroutines of Run move events:
//
//   - the loop (emitter.go) writes fresh events to Kafka; a batch Kafka
//     does not take (refused or unconfirmed) is appended to the spool, and
//     while the spool waits for Kafka (a write failed and no drain has
//     succeeded since) the loop appends its batches to the spool directly
//     instead of trying each against a broker known to be down;
//   - the disk writer appends what Emit could not put in the full buffer
//     (the spill channel): Emit never touches the disk, and when the disk
//     writer falls behind the spill channel's bound, Emit drops and counts
//     (spool_behind);
//   - the drainer reads the spool oldest first and writes it to Kafka,
//     acknowledging (and so deleting) only what Kafka acknowledged, and
//     retries with a backoff while Kafka fails; its first success ends the
//     wait, and the loop writes to Kafka again. It is paced (DrainRate):
//     a backlog must not take the CPU that decisions need.
//
// Ordering: while the spool drains, fresh events go straight to Kafka
// beside the drainer's older ones, so one key's events are not in decision
// order in their partition then. Nothing downstream depends on that order:
// rollups are sums, and duplicates (an unconfirmed write that landed and
// was sent again, a segment read again after a restart) are discarded by
// event id.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/spool"
)

// drainRateWindow is the window of the drain rate /readyz reports.
const drainRateWindow = 5 * time.Second

type spooler struct {
	e     *Emitter
	s     *spool.Spool
	spill chan metering.Event
	// down: a Kafka write failed and no write has succeeded since.
	down     atomic.Bool
	drained  atomic.Uint64
	rateBits atomic.Uint64 // float64 events/s over the last drainRateWindow

	mSpooled prometheus.Counter
	mDrained prometheus.Counter
}

func newSpooler(e *Emitter, s *spool.Spool, reg prometheus.Registerer) (*spooler, error) {
	sp := &spooler{e: e, s: s, spill: make(chan metering.Event, e.cfg.SpillBuffer),
		mSpooled: promdecl.Counter("metering_spool_spooled_events_total", "Decision events written to the spool (Kafka failed or was slow)."),
		mDrained: promdecl.Counter("metering_spool_drained_events_total", "Spooled decision events Kafka acknowledged (then deleted from the spool)."),
	}
	gauge := func(name, help string, f func(st spool.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.Stats()) })
	}
	for _, c := range []prometheus.Collector{sp.mSpooled, sp.mDrained,
		gauge("metering_spool_bytes", "Bytes of the spool's segment files.", func(st spool.Stats) float64 { return float64(st.Bytes) }),
		gauge("metering_spool_max_bytes", "The spool's byte budget (LIMITER_SPOOL_MAX_BYTES).", func(st spool.Stats) float64 { return float64(st.MaxBytes) }),
		gauge("metering_spool_events", "Decision events in the spool, not yet acknowledged by Kafka.", func(st spool.Stats) float64 { return float64(st.Records) }),
		gauge("metering_spool_oldest_event_age_seconds", "Age of the oldest decision event in the spool (its decision time); 0 when empty.",
			func(st spool.Stats) float64 { return ageSeconds(st.Oldest, time.Now()) }),
		promdecl.GaugeFunc("metering_spool_drain_events_per_second", "Spooled events Kafka acknowledged per second, over the last 5 s.", sp.rate),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("kafkaemit: metrics: %w", err)
		}
	}
	if rc := s.Recovered(); rc.Records > 0 || rc.Skipped > 0 {
		e.log.Info("the spool holds events from an earlier run: sending them", "events", rc.Records, "segments", rc.Segments)
		if rc.Skipped > 0 {
			e.log.Error("the spool had damaged records (a write torn by a kill, or a corrupted disk): skipped, never sent",
				"stretches", rc.Skipped, "bytes", rc.SkippedBytes)
			e.drop(ReasonSpoolCorrupt, rc.Skipped)
		}
	}
	return sp, nil
}

func ageSeconds(oldestMS int64, now time.Time) float64 {
	if oldestMS <= 0 {
		return 0
	}
	return max(0, now.Sub(time.UnixMilli(oldestMS)).Seconds())
}

func (sp *spooler) rate() float64 { return math.Float64frombits(sp.rateBits.Load()) }

// waiting reports that the spool is waiting for Kafka: fresh batches go to
// it directly.
func (sp *spooler) waiting() bool { return sp.down.Load() && sp.s.Stats().Records > 0 }

func (sp *spooler) kafkaOK()     { sp.down.Store(false) }
func (sp *spooler) kafkaFailed() { sp.down.Store(true) }

// append writes msgs to the spool; what does not fit is dropped and
// counted (spool_full, spool_error).
func (sp *spooler) append(msgs []kafka.Message, times []int64) {
	if len(msgs) == 0 {
		return
	}
	recs := make([]spool.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = spool.Record{Time: max(times[i], 1), Key: m.Key, Value: m.Value}
	}
	n, err := sp.s.Append(recs)
	sp.mSpooled.Add(float64(n))
	if err == nil {
		return
	}
	reason := ReasonSpoolError
	switch {
	case errors.Is(err, spool.ErrFull):
		reason = ReasonSpoolFull
	case errors.Is(err, spool.ErrTooLarge):
		reason = ReasonRefused
	default:
		sp.e.log.Error("the spool's disk refused a write", "err", err)
	}
	sp.e.drop(reason, len(msgs)-n)
}

// diskWriter appends the spill channel's events to the spool until ctx
// ends, then what is left in it.
func (sp *spooler) diskWriter(ctx context.Context) {
	b := newBatch(1024)
	flush := func() {
		for b.len() < 4096 {
			select {
			case ev := <-sp.spill:
				b.add(&ev)
				continue
			default:
			}
			break
		}
		sp.append(b.take())
	}
	for {
		select {
		case ev := <-sp.spill:
			b.add(&ev)
			flush()
		case <-ctx.Done():
			for len(sp.spill) > 0 {
				ev := <-sp.spill
				b.add(&ev)
				flush()
			}
			return
		}
	}
}

// drainer sends the spool to Kafka, oldest first, until ctx ends (the
// write in flight then runs on under wctx).
func (sp *spooler) drainer(ctx, wctx context.Context) {
	e := sp.e
	b := newBatch(e.cfg.BatchSize)
	tick := time.NewTicker(drainRateWindow)
	defer tick.Stop()
	lastAt, lastN := time.Now(), uint64(0)
	measure := func(now time.Time) {
		if d := now.Sub(lastAt); d >= drainRateWindow {
			n := sp.drained.Load()
			sp.rateBits.Store(math.Float64bits(float64(n-lastN) / d.Seconds()))
			lastAt, lastN = now, n
		}
	}
	// Paced: batches of a quarter second's worth of DrainRate (at most
	// BatchSize), each followed by the rest of its time slot. Fewer,
	// larger batches cost less per event than a tenth of a second's.
	perBatch := e.cfg.BatchSize
	if e.cfg.DrainRate > 0 {
		perBatch = max(1, min(perBatch, int(e.cfg.DrainRate/4)))
	}
	for ctx.Err() == nil {
		began := time.Now()
		measure(began)
		recs, pos, err := sp.s.Read(perBatch, 4<<20)
		if err != nil {
			e.log.Error("reading the spool failed", "err", err)
			if !sleepCtx(ctx, maxBackoff) {
				return
			}
			continue
		}
		if len(recs) == 0 {
			if err := sp.s.Ack(pos); err != nil { // damaged bytes passed over
				e.log.Error("deleting a spool segment failed", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-sp.s.Appended():
			case <-tick.C:
			}
			continue
		}
		// The messages point into the spool's buffer, valid until the next
		// Read: the producer copies them into its record batches and holds
		// none of them once a write has returned.
		msgs := b.msgs[:0]
		for _, r := range recs {
			msgs = append(msgs, kafka.Message{Key: r.Key, Value: r.Value})
		}
		b.msgs = msgs
		if !sp.deliver(ctx, wctx, msgs) {
			return // ctx ended: not acknowledged, read again at the next start
		}
		sp.kafkaOK()
		if err := sp.s.Ack(pos); err != nil {
			e.log.Error("deleting a spool segment failed", "err", err)
		}
		sp.drained.Add(uint64(len(recs)))
		sp.mDrained.Add(float64(len(recs)))
		if e.cfg.DrainRate > 0 {
			slot := time.Duration(float64(len(recs)) / e.cfg.DrainRate * float64(time.Second))
			if rest := slot - time.Since(began); rest > 0 && !sleepCtx(ctx, rest) {
				return
			}
		}
	}
}

// Backoff of the drainer's retries.
const minBackoff, maxBackoff = 100 * time.Millisecond, 2 * time.Second

// deliver writes msgs until Kafka has taken every one it ever will (a
// record it refuses for good is dropped and counted), retrying the rest
// with a backoff; false when ctx ended first. The producer holds no
// message once a write has returned, so msgs may point into buffers that
// are reused afterwards.
func (sp *spooler) deliver(ctx, wctx context.Context, msgs []kafka.Message) bool {
	e := sp.e
	for backoff := minBackoff; ; backoff = min(2*backoff, maxBackoff) {
		wc, cancel := context.WithTimeout(wctx, e.cfg.WriteTimeout)
		err := e.p.write(wc, msgs)
		cancel()
		if err == nil {
			e.sentN(len(msgs))
			return true
		}
		sp.kafkaFailed()
		failed, why := e.failures(msgs, err)
		retry := make([]kafka.Message, 0, len(failed))
		for j, i := range failed {
			if permanent(why[j], msgErr(err, i)) {
				e.drop(ReasonRefused, 1)
				continue
			}
			retry = append(retry, msgs[i])
		}
		e.sentN(len(msgs) - len(failed))
		e.log.Debug("kafka write of spooled events failed", "messages", len(msgs), "failed", len(failed), "err", err)
		if msgs = retry; len(msgs) == 0 {
			return true // what was left Kafka will never take
		}
		if !sleepCtx(ctx, backoff) {
			return false
		}
	}
}

// sleepCtx sleeps d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (sp *spooler) close() error {
	if err := sp.s.Close(); err != nil {
		return fmt.Errorf("kafkaemit: close the spool: %w", err)
	}
	return nil
}

// SpoolStatus is the spool's state, for /readyz.
type SpoolStatus struct {
	Bytes, MaxBytes int64
	Events          int64
	OldestAge       time.Duration // of the oldest event in the spool (decision time); 0 when empty
	DrainPerSecond  float64       // events Kafka acknowledged from the spool, over the last 5 s
	// WaitingForKafka: a write failed and none has succeeded since; fresh
	// events go to the spool.
	WaitingForKafka bool
}

// Spool returns the spool's state; false without a spool.
func (e *Emitter) Spool() (SpoolStatus, bool) {
	if e.sp == nil {
		return SpoolStatus{}, false
	}
	st := e.sp.s.Stats()
	return SpoolStatus{Bytes: st.Bytes, MaxBytes: st.MaxBytes, Events: st.Records,
		OldestAge:      time.Duration(ageSeconds(st.Oldest, time.Now()) * float64(time.Second)),
		DrainPerSecond: e.sp.rate(), WaitingForKafka: e.sp.waiting()}, true
}
