package chsink

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Late is an event the consumer cannot decide from memory: its id and
// decision time (ms).
type Late struct {
	ID string
	TS int64
}

// lookupBytes bounds the ids of one lookup query (the server refuses a query
// text over max_query_size, 256 KiB by default); lookupSpan bounds the
// seconds of decision time one query covers, so it reads only the granules
// of those seconds even when the late events are spread over days.
const (
	lookupBytes = 128 << 10
	lookupSpan  = 60 // seconds
)

// LateIDs calls fn for every event of late that event_ids holds for
// partition, with the position it is stored at. late is reordered.
func (s *Sink) LateIDs(ctx context.Context, partition int, late []Late, fn func(id string, position int64)) error {
	slices.SortFunc(late, func(a, b Late) int { return cmp.Compare(a.TS, b.TS) })
	for i := 0; i < len(late); {
		first := late[i].TS / 1000
		j, size := i, 0
		var ids []string
		for ; j < len(late) && late[j].TS/1000-first <= lookupSpan && size < lookupBytes; j++ {
			ids = append(ids, late[j].ID)
			size += len(late[j].ID) + 4
		}
		last := late[j-1].TS / 1000
		if err := s.lookup(ctx, partition, first, last, ids, fn); err != nil {
			return err
		}
		i = j
	}
	return nil
}

func (s *Sink) lookup(ctx context.Context, partition int, from, to int64, ids []string, fn func(string, int64)) error {
	// A GroupSet is bound as "('a', 'b')" (a []string would be an array).
	set := clickhouse.GroupSet{Value: make([]any, len(ids))}
	for i, id := range ids {
		set.Value[i] = id
	}
	// event_time is the decision time truncated to the second, as written.
	rows, err := s.conn.Query(ctx, "SELECT event_id, kafka_offset FROM "+s.table(IDs)+
		" WHERE kafka_partition = ? AND event_time >= ? AND event_time <= ? AND event_id IN ?",
		uint32(partition), time.Unix(from, 0).UTC(), time.Unix(to, 0).UTC(), set)
	if err != nil {
		return fmt.Errorf("chsink: look up %d late event ids of partition %d: %w", len(ids), partition, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var off uint64
		if err := rows.Scan(&id, &off); err != nil {
			return fmt.Errorf("chsink: look up late event ids of partition %d: %w", partition, err)
		}
		fn(id, int64(off))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("chsink: look up late event ids of partition %d: %w", partition, err)
	}
	return nil
}

// NewestBelow returns an upper bound of the decision time (ms) of every
// event event_ids holds for partition below position below: the newest one
// stored there whose decision time is at or after fromMs, or fromMs when
// there is none (ORDER BY (kafka_partition, event_time, ...): a range read
// of the seconds from fromMs on).
func (s *Sink) NewestBelow(ctx context.Context, partition int, below, fromMs int64) (int64, error) {
	var n uint64
	var newest time.Time
	if err := s.conn.QueryRow(ctx, "SELECT count(), max(event_time) FROM "+s.table(IDs)+
		" WHERE kafka_partition = ? AND event_time >= ? AND kafka_offset < ?",
		uint32(partition), time.Unix(max(fromMs, 0)/1000, 0).UTC(), uint64(max(below, 0))).Scan(&n, &newest); err != nil {
		return 0, fmt.Errorf("chsink: newest event of partition %d below %d: %w", partition, below, err)
	}
	if n == 0 {
		return fromMs, nil
	}
	// event_time is truncated to the second: the event may be up to 999 ms later.
	return max(fromMs, newest.UnixMilli()+999), nil
}
