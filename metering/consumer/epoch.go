package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

// Which log is this? Before a partition is read (every resume), the
// consumer checks that the log the broker holds is the one ClickHouse's
// progress belongs to (chsink/epochs.go: positions, epochs). The check is
// by content, not by name: the event id that decisions_raw holds at its
// last stored offset must be the event the log holds at that offset. Event
// ids are unique, so an equal id means the same log (a cluster restored
// from a copy of its disks included), and another id means another log. A
// topic's identity in Kafka (its topic ID) would say less — it changes
// neither when a cluster is restored nor when a log is truncated — and
// kafka-go does not expose it.
//
//   - The stored event is in the log and is the same: the same log. Read on;
//     if the log now ends below the resume point, it lost its tail (an
//     unclean leader election): a new epoch (truncated) starts at its end.
//   - The stored event is in the log and is another event: the log was
//     replaced and has grown past the stored offset (replaced): a new epoch
//     starts at the log's start.
//   - The log ends at or below the stored event (the broker says the offset
//     is out of range): truncated if the highest stored event below its end
//     is still there and the same, else the log started over (restarted: a
//     fresh broker, a recreated topic, another cluster): a new epoch starts
//     at the log's start. A log that ends exactly at the stored offset is
//     not out of range there (a fetch at the end waits): another event
//     below its end is then the definite answer (replaced).
//   - The stored event was deleted by retention, or none is stored: the
//     bounds decide. A resume point past the end (out of range) is a log
//     that started over; one below the start is a real gap: retention
//     deleted messages before they were read. They are skipped, counted
//     (meter_log_gap_messages_total) and alerted, never taken for a new
//     epoch, since the log is the same.
//
// A new epoch is decided only on a definite answer: a high watermark below
// an offset that a fetch does not call out of range (a new leader whose
// watermark lags) is an error, retried, never a new epoch. Its first
// position is one past the highest any table holds, so nothing of the new
// log is taken for something already written, and the deduplication window
// (positions) spans the boundary: a producer retry that put an event into
// both logs is still dropped. The epoch is recorded, after the group
// confirmed this member's ownership, before its first batch.

// kafkaLog asks the broker about one partition's log, on its own transport.
type kafkaLog struct {
	client    *kafka.Client
	transport *kafka.Transport
	topic     string
	partition int
	timeout   time.Duration
}

func (c *Consumer) kafkaLog(p int) *kafkaLog {
	client, tr := c.kafkaClient("meter-consumer")
	return &kafkaLog{
		client: client, transport: tr,
		topic: c.cfg.Topic, partition: p, timeout: c.cfg.FetchTimeout,
	}
}

func (l *kafkaLog) close() { l.transport.CloseIdleConnections() }

// bounds returns the log's first offset and its end (the high watermark:
// one past the last message a consumer can read).
func (l *kafkaLog) bounds(ctx context.Context) (start, end int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	res, err := l.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{l.topic: {kafka.FirstOffsetOf(l.partition), kafka.LastOffsetOf(l.partition)}},
	})
	if err != nil {
		return 0, 0, fmt.Errorf("partition %d: the log's bounds: %w", l.partition, err)
	}
	for _, po := range res.Topics[l.topic] {
		if po.Partition != l.partition {
			continue
		}
		if po.Error != nil {
			return 0, 0, fmt.Errorf("partition %d: the log's bounds: %w", l.partition, po.Error)
		}
		return po.FirstOffset, po.LastOffset, nil
	}
	return 0, 0, fmt.Errorf("partition %d: the broker did not list the log's bounds", l.partition)
}

// probe is what the log holds at one offset.
type probe int

const (
	holds      probe = iota // a message at that offset
	outOfRange              // the broker says the offset is out of range
	nothing                 // no message there yet (at or past the readable end)
)

// eventID reads the message at offset: its event id ("" when it is not a
// decodable event) and whether the log holds it.
func (l *kafkaLog) eventID(ctx context.Context, offset int64) (string, probe, error) {
	const wait = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, wait+l.timeout)
	defer cancel()
	resp, err := l.client.Fetch(ctx, &kafka.FetchRequest{
		Topic: l.topic, Partition: l.partition, Offset: offset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: wait,
	})
	if err != nil {
		return "", nothing, fmt.Errorf("partition %d: read offset %d: %w", l.partition, offset, err)
	}
	if resp.Error != nil {
		if errors.Is(resp.Error, kafka.OffsetOutOfRange) {
			return "", outOfRange, nil
		}
		return "", nothing, fmt.Errorf("partition %d: read offset %d: %w", l.partition, offset, resp.Error)
	}
	for {
		rec, err := resp.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return "", nothing, nil
		}
		if err != nil {
			return "", nothing, fmt.Errorf("partition %d: read offset %d: %w", l.partition, offset, err)
		}
		if rec.Offset < offset {
			release(rec)
			continue
		}
		if rec.Offset > offset {
			release(rec)
			return "", nothing, nil // not there (a compacted log)
		}
		var value bytes.Buffer
		if err := writeValue(&value, rec); err != nil {
			return "", nothing, fmt.Errorf("partition %d: read offset %d: %w", l.partition, offset, err)
		}
		var dec metering.Decoder
		ev, err := dec.Decode(value.Bytes())
		if err != nil {
			return "", holds, nil
		}
		return ev.EventID, holds, nil
	}
}

// errUnsure is a check of the log that got no definite answer; it is
// retried, and never starts a new epoch.
var errUnsure = errors.New("the log's bounds and its contents disagree")

// locate returns the epoch to read partition p in and the Kafka offset to
// read next, recording a new epoch when the log is not the one of the
// stored progress (see the comment at the top of this file). eps are the
// partition's epochs (oldest first); resume and seenUpTo are the lowest
// table progress plus one and the highest (positions).
func (c *Consumer) locate(ctx context.Context, gen *kafka.Generation, p int, eps []chsink.Epoch, resume, seenUpTo int64) (chsink.Epoch, int64, error) {
	cur := eps[len(eps)-1]
	kl := c.kafkaLog(p)
	defer kl.close()
	start, end, err := kl.bounds(ctx)
	if err != nil {
		return cur, 0, err
	}
	next := cur.Offset(max(resume, cur.First)) // Kafka offset to read next in cur
	newEpoch := func(reason chsink.EpochReason, from int64, why string) (chsink.Epoch, int64, error) {
		return c.newEpoch(ctx, gen, p, cur, resume, seenUpTo, next, reason, from, start, end, why)
	}
	lctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	id, pos, ok, err := c.cfg.Sink.LastID(lctx, p, cur.First, cur.Position(next))
	cancel()
	if err != nil {
		return cur, 0, err
	}
	if ok {
		at := cur.Offset(pos)
		switch {
		case at >= start && at < end:
			got, pr, err := kl.eventID(ctx, at)
			if err != nil {
				return cur, 0, err
			}
			if pr != holds {
				return cur, 0, fmt.Errorf("partition %d: offset %d is within the log's bounds [%d, %d) but the broker does not return it: %w", p, at, start, end, errUnsure)
			}
			if got != id {
				return newEpoch(chsink.Replaced, start, fmt.Sprintf("the log holds event %q at offset %d, where ClickHouse holds %q", got, at, id))
			}
			if next > end {
				return newEpoch(chsink.Truncated, end, fmt.Sprintf("the log ends at %d, below the resume point %d, and holds the stored event at %d", end, next, at))
			}
			return cur, next, nil
		case at >= end:
			_, pr, err := kl.eventID(ctx, at)
			if err != nil {
				return cur, 0, err
			}
			// What the log holds below its end, against what is stored
			// there: the same event (truncated, or a watermark that lags)
			// or another one (another log).
			lctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
			id2, pos2, ok2, err := c.cfg.Sink.LastID(lctx, p, cur.First, cur.Position(end))
			cancel()
			if err != nil {
				return cur, 0, err
			}
			below, got2 := nothing, ""
			if ok2 && cur.Offset(pos2) >= start {
				if got2, below, err = kl.eventID(ctx, cur.Offset(pos2)); err != nil {
					return cur, 0, err
				}
			}
			if pr != outOfRange {
				// A fetch at the end itself waits rather than being out of
				// range, so a log that ends exactly at the stored offset
				// is told by content alone.
				if below == holds && got2 != id2 {
					return newEpoch(chsink.Replaced, start, fmt.Sprintf("the log [%d, %d) holds event %q at offset %d, where ClickHouse holds %q", start, end, got2, cur.Offset(pos2), id2))
				}
				return cur, 0, fmt.Errorf("partition %d: the log's end %d is at or below the last stored offset %d, which the broker does not call out of range: %w", p, end, at, errUnsure)
			}
			// Shorter than what is stored: truncated if what is stored
			// below its end is still there, else another log.
			if below == holds && got2 == id2 {
				return newEpoch(chsink.Truncated, end, fmt.Sprintf("the log ends at %d, below the stored offset %d, and holds the stored event at %d", end, at, cur.Offset(pos2)))
			}
			return newEpoch(chsink.Restarted, start, fmt.Sprintf("the log [%d, %d) ends below the stored offset %d", start, end, at))
		}
		// The stored event was deleted by retention: the bounds decide.
	}
	if next > end {
		_, pr, err := kl.eventID(ctx, next)
		if err != nil {
			return cur, 0, err
		}
		if pr != outOfRange {
			return cur, 0, fmt.Errorf("partition %d: the log's end %d is below the resume point %d, which the broker does not call out of range: %w", p, end, next, errUnsure)
		}
		return newEpoch(chsink.Restarted, start, fmt.Sprintf("the log [%d, %d) ends below the resume point %d", start, end, next))
	}
	if next < start {
		gap := start - next
		c.m.gaps.WithLabelValues(strconv.Itoa(p)).Add(float64(gap))
		c.log.Error("messages deleted by retention before they were read: skipping them; usage under-counts",
			"partition", p, "epoch", cur.Epoch, "from", next, "to", start-1, "messages", gap)
		return cur, start, nil
	}
	return cur, next, nil
}

// newEpoch records epoch cur.Epoch+1 of partition p, beginning at Kafka
// offset from.
func (c *Consumer) newEpoch(ctx context.Context, gen *kafka.Generation, p int, cur chsink.Epoch, resume, seenUpTo, prevNext int64,
	reason chsink.EpochReason, from, logStart, logEnd int64, why string) (chsink.Epoch, int64, error) {
	first := max(seenUpTo+1, cur.First)
	e := chsink.Epoch{
		Epoch: cur.Epoch + 1, Base: first - from, First: first, Start: from, Reason: reason,
		LogStart: logStart, LogEnd: logEnd, PrevNext: prevNext, Detected: time.Now(),
	}
	if reason != chsink.Truncated {
		// A new log begins at offset 0: what lies below its start was
		// deleted before it could be read.
		e.Gap = from
	}
	// Only the partition's owner records its epochs (as for batches: the
	// coordinator refuses a member it no longer counts).
	if err := gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: {p: from}}); err != nil {
		return cur, 0, fmt.Errorf("partition %d: new epoch not recorded: the group coordinator did not confirm that this member owns the partition: %w", p, err)
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	defer cancel()
	if err := c.cfg.Sink.AddEpoch(wctx, p, e); err != nil {
		return cur, 0, err
	}
	label := strconv.Itoa(p)
	c.m.epochs.WithLabelValues(label, string(reason)).Inc()
	if e.Gap > 0 {
		c.m.gaps.WithLabelValues(label).Add(float64(e.Gap))
	}
	c.log.Warn("partition log started over: new epoch; reading the new log from its start, history kept",
		"partition", p, "epoch", e.Epoch, "reason", string(reason), "why", why, "start_offset", from, "first_position", first,
		"log_start", logStart, "log_end", logEnd, "deleted_unread", e.Gap)
	if resume <= seenUpTo {
		// Some tables had not reached the others when the old log went:
		// they lack what only the old log held.
		c.log.Error("tables behind the others lose the end of the previous log",
			"partition", p, "positions_from", resume, "positions_to", seenUpTo)
	}
	return e, from, nil
}
