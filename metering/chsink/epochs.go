package chsink

import (
	"context"
	"fmt"
	"time"
)

// Epochs (schema/0052_kafka_epochs.sql). A Kafka partition's log can start
// over: a topic deleted and created again, a move to another cluster, a
// development broker that keeps nothing. Its offsets then begin again below
// the ones the tables hold, and read as Kafka offsets they would make the
// consumer skip the new log. So the tables store a position instead: the
// Kafka offset plus the base of the log's epoch, one increasing sequence per
// partition across every incarnation of its log. Epoch 0 has base 0 (until a
// log starts over, the position is the Kafka offset); each later epoch is a
// row of kafka_epochs, written by the consumer before the epoch's first
// batch. Progress, markers and the deduplication window are all in
// positions, so they work across the boundary unchanged.

// EpochReason says why a new epoch began.
type EpochReason string

// The reasons of a new epoch.
const (
	// Restarted: the log ends below the positions the tables hold and no
	// stored event is found in it (a fresh broker, a recreated topic that
	// has not yet grown past the stored offset, another cluster).
	Restarted EpochReason = "restarted"
	// Replaced: the log holds another event at the offset of the last
	// stored one (recreated, and already grown past it).
	Replaced EpochReason = "replaced"
	// Truncated: the same log lost its tail (an unclean leader election):
	// the new epoch starts at the log's end, below which the tables agree
	// with it.
	Truncated EpochReason = "truncated"
)

// Epoch is one incarnation of a partition's log.
type Epoch struct {
	Epoch uint32
	// Base maps the epoch's Kafka offsets to positions: position = offset + Base.
	Base int64
	// First is the epoch's first position: one past the highest position
	// any table held when it began.
	First int64
	// Start is the Kafka offset the epoch begins at (First - Base).
	Start  int64
	Reason EpochReason
	// LogStart and LogEnd are the log's bounds when the epoch was detected;
	// PrevNext is the offset the previous epoch would have read next; Gap
	// is how many messages of the new log were deleted before they could be
	// read (its start above 0).
	LogStart, LogEnd, PrevNext, Gap int64
	Detected                        time.Time
}

// Position is the position of the epoch's Kafka offset.
func (e Epoch) Position(offset int64) int64 { return offset + e.Base }

// Offset is the Kafka offset of a position of the epoch.
func (e Epoch) Offset(position int64) int64 { return position - e.Base }

// Epochs reads the epochs of partition, oldest first, epoch 0 included. If
// two consumers recorded the same epoch (a member dropped from the group
// racing its successor), the first recorded wins, everywhere the same way.
func (s *Sink) Epochs(ctx context.Context, partition int) ([]Epoch, error) {
	out := []Epoch{{}}
	rows, err := s.conn.Query(ctx, "SELECT epoch, argMin(base, detected_ms), argMin(first_position, detected_ms), argMin(start_offset, detected_ms), argMin(reason, detected_ms), "+
		"argMin(log_start, detected_ms), argMin(log_end, detected_ms), argMin(prev_next, detected_ms), argMin(gap, detected_ms), min(detected_ms) FROM "+s.epochsTable()+
		" WHERE kafka_partition = ? GROUP BY epoch ORDER BY epoch", uint32(partition))
	if err != nil {
		return nil, fmt.Errorf("chsink: epochs of partition %d: %w", partition, err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Epoch
		var first, start, logStart, logEnd, gap, ms uint64
		var reason string
		if err := rows.Scan(&e.Epoch, &e.Base, &first, &start, &reason, &logStart, &logEnd, &e.PrevNext, &gap, &ms); err != nil {
			return nil, fmt.Errorf("chsink: epochs of partition %d: %w", partition, err)
		}
		e.First, e.Start, e.Reason = int64(first), int64(start), EpochReason(reason)
		e.LogStart, e.LogEnd, e.Gap, e.Detected = int64(logStart), int64(logEnd), int64(gap), time.UnixMilli(int64(ms)).UTC()
		if e.Epoch == 0 {
			continue // never written; epoch 0 is implicit
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chsink: epochs of partition %d: %w", partition, err)
	}
	return out, nil
}

// AddEpoch records e for partition; the consumer does it before the epoch's
// first batch.
func (s *Sink) AddEpoch(ctx context.Context, partition int, e Epoch) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.epochsTable()+
		" (kafka_partition, epoch, base, first_position, start_offset, reason, log_start, log_end, prev_next, gap, detected_at, detected_ms)")
	if err != nil {
		return fmt.Errorf("chsink: record epoch %d of partition %d: %w", e.Epoch, partition, err)
	}
	d := e.Detected.UTC()
	if err := b.Append(uint32(partition), e.Epoch, e.Base, uint64(e.First), uint64(e.Start), string(e.Reason),
		uint64(max(e.LogStart, 0)), uint64(max(e.LogEnd, 0)), e.PrevNext, uint64(max(e.Gap, 0)), d.Truncate(time.Second), uint64(d.UnixMilli())); err != nil {
		_ = b.Abort()
		return fmt.Errorf("chsink: record epoch %d of partition %d: %w", e.Epoch, partition, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("chsink: record epoch %d of partition %d: %w", e.Epoch, partition, err)
	}
	return nil
}

// LastID returns the event id and position of the highest row decisions_raw
// holds for partition at a position in [from, below); ok is false when there
// is none. The consumer compares it with the log to tell whether the log is
// still the one it was reading.
func (s *Sink) LastID(ctx context.Context, partition int, from, below int64) (id string, position int64, ok bool, err error) {
	if below <= from || below <= 0 {
		return "", 0, false, nil
	}
	rows, err := s.conn.Query(ctx, "SELECT event_id, kafka_offset FROM "+s.table(Raw)+
		" WHERE kafka_partition = ? AND kafka_offset >= ? AND kafka_offset < ? ORDER BY kafka_offset DESC LIMIT 1",
		uint32(partition), uint64(max(from, 0)), uint64(below))
	if err != nil {
		return "", 0, false, fmt.Errorf("chsink: last event of partition %d below %d: %w", partition, below, err)
	}
	defer rows.Close()
	if rows.Next() {
		var off uint64
		if err := rows.Scan(&id, &off); err != nil {
			return "", 0, false, fmt.Errorf("chsink: last event of partition %d below %d: %w", partition, below, err)
		}
		return id, int64(off), true, nil
	}
	if err := rows.Err(); err != nil {
		return "", 0, false, fmt.Errorf("chsink: last event of partition %d below %d: %w", partition, below, err)
	}
	return "", 0, false, nil
}

// epochsName is kafka_epochs' name in ClickHouse.
const epochsName = "kafka_epochs"

func (s *Sink) epochsTable() string { return s.db + "." + epochsName + s.suffix }
