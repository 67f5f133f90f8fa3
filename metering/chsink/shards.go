package chsink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
)

// Cluster mode: the tables are replicated, sharded and read
// through Distributed tables (schema/cluster.go). The consumer writes
// Kafka partition p into the _local tables of shard ShardOf(p, shards) —
// one fixed shard per partition, so its progress markers and its
// deduplication window are on that shard alone, exactly as on a single
// server, and the per-partition exactness argument of this package holds
// shard by shard.
//
// Replicas. Within a shard any replica accepts inserts, and a part written
// to one reaches the others through ZooKeeper, asynchronously. So a replica
// can lack the newest parts of another; reading progress from it would
// resume too early and count those offsets twice once the parts arrive. A
// replica therefore answers Progress only once it has caught up: every
// entry of the shared replication log that existed when the read began is
// pulled into its queue and no part fetch created before then is still
// pending (Sharded.caughtUp). If the replica holding a part nobody else has
// is down, the partition waits (not ready) until it is back: exactness
// before availability. Otherwise — the usual case: a replica stops after
// its parts were copied — the other replica serves the partition at once.
// A partition's progress reads and writes then stay on the replica that
// answered, until an error makes the consumer read progress again.

// ShardOf is the shard that owns Kafka partition p among shards shards:
// p mod shards (shards are numbered from 0 in the order CLICKHOUSE_SHARDS
// lists them, internal/chcluster). Stable as long as the number of shards and their order do
// not change; adding a shard moves partitions and needs their rows moved
// with them (docs/scaling.md, "ClickHouse cluster mode").
func ShardOf(partition, shards int) int { return partition % shards }

// Sharded is the consumer's Sink in cluster mode: it routes each partition
// to its shard and, within the shard, to a caught-up replica.
type Sharded struct {
	shards  [][]*Sink // [shard][replica], each on its own connection to one server
	catchUp time.Duration

	mu      sync.Mutex
	current map[int]*Sink // partition → the replica its last Progress read
}

// NewSharded returns the cluster-mode sink: replicas[i][j] is a connection
// to replica j of shard i (one server per connection: progress must be read
// from the replica that was checked). The schema must be applied in cluster
// form (schema.ApplyCluster). observe may be nil.
func NewSharded(replicas [][]driver.Conn, database string, observe Observer) (*Sharded, error) {
	if len(replicas) == 0 {
		return nil, errors.New("chsink: cluster mode without shards")
	}
	s := &Sharded{catchUp: 20 * time.Second, current: map[int]*Sink{}}
	for i, shard := range replicas {
		if len(shard) == 0 {
			return nil, fmt.Errorf("chsink: shard %d has no replica", i+1)
		}
		var sinks []*Sink
		for _, conn := range shard {
			sk, err := New(conn, database, observe)
			if err != nil {
				return nil, err
			}
			sk.suffix = schema.LocalSuffix
			sinks = append(sinks, sk)
		}
		s.shards = append(s.shards, sinks)
	}
	return s, nil
}

// Shards is the number of shards.
func (s *Sharded) Shards() int { return len(s.shards) }

// Progress reads partition's progress from the first replica of its shard
// that answers and has caught up, and keeps that replica for the
// partition's writes.
func (s *Sharded) Progress(ctx context.Context, partition int) (Progress, error) {
	shard := ShardOf(partition, len(s.shards))
	var errs []error
	for j, r := range s.shards[shard] {
		if err := r.caughtUp(ctx, s.catchUp); err != nil {
			errs = append(errs, fmt.Errorf("shard %d replica %d: %w", shard+1, j+1, err))
			continue
		}
		p, err := r.Progress(ctx, partition)
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %d replica %d: %w", shard+1, j+1, err))
			continue
		}
		s.mu.Lock()
		s.current[partition] = r
		s.mu.Unlock()
		return p, nil
	}
	return Progress{}, fmt.Errorf("chsink: no caught-up replica for partition %d: %w", partition, errors.Join(errs...))
}

func (s *Sharded) replica(partition int) (*Sink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.current[partition]
	if r == nil {
		return nil, fmt.Errorf("chsink: partition %d: no replica chosen (Progress first)", partition)
	}
	return r, nil
}

// RecentIDs reads the deduplication window from the replica Progress chose.
func (s *Sharded) RecentIDs(ctx context.Context, partition int, after int64, fn func(id string, offset, ts int64)) error {
	r, err := s.replica(partition)
	if err != nil {
		return err
	}
	return r.RecentIDs(ctx, partition, after, fn)
}

// LateIDs looks late events up on the replica Progress chose.
func (s *Sharded) LateIDs(ctx context.Context, partition int, late []Late, fn func(id string, position int64)) error {
	r, err := s.replica(partition)
	if err != nil {
		return err
	}
	return r.LateIDs(ctx, partition, late, fn)
}

// NewestBelow reads from the replica Progress chose.
func (s *Sharded) NewestBelow(ctx context.Context, partition int, below, fromMs int64) (int64, error) {
	r, err := s.replica(partition)
	if err != nil {
		return 0, err
	}
	return r.NewestBelow(ctx, partition, below, fromMs)
}

// Epochs reads the partition's epochs from the replica Progress chose.
func (s *Sharded) Epochs(ctx context.Context, partition int) ([]Epoch, error) {
	r, err := s.replica(partition)
	if err != nil {
		return nil, err
	}
	return r.Epochs(ctx, partition)
}

// AddEpoch records an epoch on the replica Progress chose.
func (s *Sharded) AddEpoch(ctx context.Context, partition int, e Epoch) error {
	r, err := s.replica(partition)
	if err != nil {
		return err
	}
	return r.AddEpoch(ctx, partition, e)
}

// LastID reads from the replica Progress chose.
func (s *Sharded) LastID(ctx context.Context, partition int, from, below int64) (string, int64, bool, error) {
	r, err := s.replica(partition)
	if err != nil {
		return "", 0, false, err
	}
	return r.LastID(ctx, partition, from, below)
}

// Write writes the batch to the replica Progress chose. On error the
// consumer reads Progress again, which may choose another replica.
func (s *Sharded) Write(ctx context.Context, partition int, recs []Record, last int64, p *Progress) error {
	r, err := s.replica(partition)
	if err != nil {
		return err
	}
	err = r.Write(ctx, partition, recs, last, p)
	if err != nil {
		s.mu.Lock()
		delete(s.current, partition)
		s.mu.Unlock()
	}
	return err
}

// caughtUp waits (up to within) until this replica holds every part that
// any replica of its shard had committed when the call began: each local
// table's replication log pointer is past the log's last entry of then,
// and no part fetch created before then is still queued.
func (s *Sink) caughtUp(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	// The tables of the consumer's progress, and its epochs.
	tables := []string{"'" + epochsName + s.suffix + "'"}
	for t := Table(0); t < firstCarry; t++ { // the carry streams' tables are among them
		tables = append(tables, "'"+tableNames[t]+s.suffix+"'")
	}
	in := "(" + strings.Join(tables, ", ") + ")"
	var began time.Time
	if err := s.conn.QueryRow(ctx, "SELECT now()").Scan(&began); err != nil {
		return fmt.Errorf("catch up: %w", err)
	}
	// The log's last index per table, as of now (read from ZooKeeper).
	rows, err := s.conn.Query(ctx, "SELECT table, zookeeper_path, is_readonly FROM system.replicas WHERE database = ? AND table IN "+in, s.db)
	if err != nil {
		return fmt.Errorf("catch up: %w", err)
	}
	target := map[string]int64{} // table → last log index to have pulled; -1 for an empty log
	paths := map[string]string{}
	for rows.Next() {
		var table, path string
		var readonly uint8
		if err := rows.Scan(&table, &path, &readonly); err != nil {
			rows.Close()
			return fmt.Errorf("catch up: %w", err)
		}
		if readonly != 0 {
			rows.Close()
			return fmt.Errorf("catch up: %s is read-only (no ZooKeeper session)", table)
		}
		paths[table] = path
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("catch up: %w", err)
	}
	if len(paths) != len(tables) {
		return fmt.Errorf("catch up: %d of %d replicated tables in %s (schema not applied in cluster form?)", len(paths), len(tables), s.db)
	}
	for table, path := range paths {
		var n uint64
		var last string
		if err := s.conn.QueryRow(ctx, "SELECT count(), max(name) FROM system.zookeeper WHERE path = ?", path+"/log").Scan(&n, &last); err != nil {
			return fmt.Errorf("catch up: replication log of %s: %w", table, err)
		}
		target[table] = -1
		if n > 0 {
			i, err := strconv.ParseInt(strings.TrimPrefix(last, "log-"), 10, 64)
			if err != nil {
				return fmt.Errorf("catch up: replication log entry %q of %s: %w", last, table, err)
			}
			target[table] = i
		}
	}
	for {
		behind, err := s.behind(ctx, in, target, began)
		if err == nil && behind == "" {
			return nil
		}
		if err == nil {
			err = errors.New(behind)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("catch up: not caught up: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// behind says what this replica still lacks ("" when nothing).
func (s *Sink) behind(ctx context.Context, in string, target map[string]int64, began time.Time) (string, error) {
	rows, err := s.conn.Query(ctx, "SELECT table, log_pointer FROM system.replicas WHERE database = ? AND table IN "+in, s.db)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	for rows.Next() {
		var table string
		var ptr uint64
		if err := rows.Scan(&table, &ptr); err != nil {
			return "", err
		}
		// log_pointer is the index of the next entry to pull.
		if int64(ptr) <= target[table] {
			return fmt.Sprintf("%s has pulled the replication log up to %d of %d", table, int64(ptr)-1, target[table]), nil
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	var pending uint64
	var oldest string
	if err := s.conn.QueryRow(ctx, "SELECT count(), any(new_part_name) FROM system.replication_queue WHERE database = ? AND table IN "+in+
		" AND type = 'GET_PART' AND create_time <= ?", s.db, began).Scan(&pending, &oldest); err != nil {
		return "", err
	}
	if pending > 0 {
		return fmt.Sprintf("%d part(s) still to fetch from another replica (e.g. %s)", pending, oldest), nil
	}
	return "", nil
}
