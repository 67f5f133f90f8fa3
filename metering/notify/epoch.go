package notify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/schema"
)

// Which log is this? The rule of the meter consumer (metering/consumer,
// epoch.go), applied to the notifier's own progress. Kafka's committed
// offset says where the group stopped, not in which log: a topic deleted
// and created again, another Kafka cluster or a development broker that
// starts empty begins its offsets again, and the old committed offset would
// skip the new log's first messages, or wait past its end for ever. So the
// notifier records, about once a second per partition, the event id it
// decided at an offset (notifier_checkpoints), and on every assignment, and
// after every failed fetch, compares the latest checkpoint with the event
// the broker holds at that offset:
//
//   - the same event id: the same log; read on from the committed offset
//     (from the log's end if that is below it: the log lost its tail; from
//     its start if retention deleted what lies below: those are gone);
//   - no usable checkpoint and a log that ends below the committed offset:
//     a log never shrinks, so it is another one, read from its start;
//   - another event, or none because the log ends at or below the
//     checkpoint: the log started over; read it from its start, and record
//     the start (a checkpoint at offset -1) so the next check has nothing
//     of the old log to compare;
//   - no checkpoint, or one below the log's start (deleted by retention):
//     nothing tells the logs apart; the committed offset stands.
//
// A webhook is never sent twice for one event because the cool-down is
// judged by the event's time and restored from webhook_deliveries at start;
// reading a log again from its start therefore costs reads, not webhooks.

// checkpoint is one row of notifier_checkpoints: event id at offset.
type checkpoint struct {
	offset int64 // -1: a log read from its start, nothing to compare
	id     string
}

// latestCheckpoint returns the partition's latest checkpoint; ok is false
// when there is none.
func (n *Notifier) latestCheckpoint(ctx context.Context, p int) (checkpoint, bool, error) {
	rows, err := n.cfg.Conn.Query(ctx, "SELECT kafka_offset, event_id FROM "+n.cfg.Database+"."+schema.NotifierCheckpoints+
		" WHERE kafka_partition = ? ORDER BY recorded_ms DESC LIMIT 1", uint32(p))
	if err != nil {
		return checkpoint{}, false, fmt.Errorf("notifier: latest checkpoint of partition %d: %w", p, err)
	}
	defer rows.Close()
	if !rows.Next() {
		return checkpoint{}, false, rows.Err()
	}
	var c checkpoint
	if err := rows.Scan(&c.offset, &c.id); err != nil {
		return checkpoint{}, false, fmt.Errorf("notifier: latest checkpoint of partition %d: %w", p, err)
	}
	return c, true, nil
}

// saveCheckpoints writes the checkpoints of several partitions in one INSERT.
func (n *Notifier) saveCheckpoints(ctx context.Context, cps map[int]checkpoint) error {
	b, err := n.cfg.Conn.PrepareBatch(ctx, "INSERT INTO "+n.cfg.Database+"."+schema.NotifierCheckpoints+
		" (kafka_partition, kafka_offset, event_id, recorded_at, recorded_ms)")
	if err != nil {
		return fmt.Errorf("notifier: save checkpoints: %w", err)
	}
	now := n.cfg.Now().UTC()
	for p, c := range cps {
		if err := b.Append(uint32(p), c.offset, c.id, now.Truncate(time.Second), uint64(now.UnixMilli())); err != nil {
			_ = b.Abort()
			return fmt.Errorf("notifier: save checkpoints: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("notifier: save checkpoints: %w", err)
	}
	return nil
}

// locate returns the offset to read partition p from, given the offset the
// group committed (kafka.FirstOffset when none), by the rule above.
func (n *Notifier) locate(ctx context.Context, client *kafka.Client, p int, committed int64) (int64, error) {
	start, end, err := n.bounds(ctx, client, p)
	if err != nil {
		return 0, err
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cp, ok, err := n.latestCheckpoint(qctx, p)
	cancel()
	if err != nil {
		return 0, err
	}
	restartAt := func(why string) (int64, error) {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := n.saveCheckpoints(wctx, map[int]checkpoint{p: {offset: -1}}); err != nil {
			return 0, err
		}
		n.m.epochs.Inc()
		n.log.Warn("notifier: partition log started over; reading it from its start", "partition", p, "why", why,
			"committed", committed, "log_start", start, "log_end", end)
		return start, nil
	}
	same := false // the checkpoint's event is in this log, where it was
	if ok && cp.offset >= start {
		if cp.offset >= end {
			return restartAt(fmt.Sprintf("the log [%d, %d) ends at or below the checkpoint at %d", start, end, cp.offset))
		}
		got, err := n.eventAt(ctx, client, p, cp.offset)
		if err != nil {
			return 0, err
		}
		if got != cp.id {
			return restartAt(fmt.Sprintf("the log holds event %q at offset %d, where the checkpoint says %q", got, cp.offset, cp.id))
		}
		same = true
	}
	switch {
	case committed < 0: // nothing committed yet
		return start, nil
	case committed > end && same:
		return end, nil // the same log lost its tail
	case committed > end:
		// A log does not shrink: without a checkpoint to say it lost its
		// tail, it is another one.
		return restartAt(fmt.Sprintf("the log [%d, %d) ends below the committed offset %d", start, end, committed))
	case committed < start:
		return start, nil
	}
	return committed, nil
}

// bounds returns the partition log's first offset and its end.
func (n *Notifier) bounds(ctx context.Context, client *kafka.Client, p int) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{n.cfg.Topic: {kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p)}},
	})
	if err != nil {
		return 0, 0, fmt.Errorf("partition %d: the log's bounds: %w", p, err)
	}
	for _, po := range res.Topics[n.cfg.Topic] {
		if po.Partition == p {
			if po.Error != nil {
				return 0, 0, fmt.Errorf("partition %d: the log's bounds: %w", p, po.Error)
			}
			return po.FirstOffset, po.LastOffset, nil
		}
	}
	return 0, 0, fmt.Errorf("partition %d: the broker did not list the log's bounds", p)
}

// eventAt is the event id of the message at offset ("" when it is not a
// decodable event or not there).
func (n *Notifier) eventAt(ctx context.Context, client *kafka.Client, p int, offset int64) (string, error) {
	msgs, _, err := n.fetch(ctx, client, p, offset, 100*time.Millisecond)
	if err != nil {
		return "", err
	}
	if len(msgs) == 0 || msgs[0].offset != offset {
		return "", nil
	}
	ev, err := metering.Decode(msgs[0].value)
	if err != nil {
		return "", nil
	}
	return ev.EventID, nil
}

type fetched struct {
	partition int
	offset    int64
	value     []byte
}

// fetch reads the messages of partition p at offset and after; the broker
// may wait up to wait for some to arrive, and the round trip is given wait
// plus readerMaxWait.
func (n *Notifier) fetch(ctx context.Context, client *kafka.Client, p int, offset int64, wait time.Duration) ([]fetched, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+readerMaxWait)
	defer cancel()
	resp, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: n.cfg.Topic, Partition: p, Offset: offset,
		MinBytes: 1, MaxBytes: readerMaxBytes, MaxWait: wait})
	if err == nil && resp.Error != nil {
		err = resp.Error
	}
	if err != nil {
		return nil, offset, fmt.Errorf("fetch partition %d at offset %d: %w", p, offset, err)
	}
	var out []fetched
	next := offset
	for {
		rec, err := resp.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, offset, fmt.Errorf("fetch partition %d at offset %d: %w", p, offset, err)
		}
		v, err := protocol.ReadAll(rec.Value)
		if rec.Key != nil {
			rec.Key.Close()
		}
		if rec.Value != nil {
			rec.Value.Close()
		}
		if err != nil {
			return nil, offset, fmt.Errorf("fetch partition %d at offset %d: %w", p, offset, err)
		}
		if rec.Offset < offset {
			continue
		}
		out = append(out, fetched{partition: p, offset: rec.Offset, value: v})
		next = rec.Offset + 1
	}
	return out, next, nil
}
