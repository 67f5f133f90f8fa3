package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/schema"
)

// openClickHouse opens a native-protocol connection to addr with the
// binary's credentials and TLS (internal/chconn, the one place the options
// are built); its Ping explains a refused login or certificate.
func openClickHouse(cfg config, addr string) (driver.Conn, error) {
	return cfg.ClickHouse.At(addr).Open(chsink.Pool)
}

// store is where metering writes: the one server of CLICKHOUSE_ADDR
// (single-node mode), or every replica of every shard of
// CLICKHOUSE_SHARDS (cluster mode, one connection per server).
type store struct {
	cfg    config
	log    *slog.Logger
	conn   driver.Conn     // CLICKHOUSE_ADDR
	shards [][]driver.Conn // cluster mode: [shard][replica]
}

func buildStore(cfg config, conn driver.Conn, log *slog.Logger) (*store, error) {
	s := &store{cfg: cfg, log: log, conn: conn}
	for _, shard := range cfg.Cluster.Shards {
		var replicas []driver.Conn
		for _, addr := range shard {
			c, err := openClickHouse(cfg, addr)
			if err != nil {
				s.close()
				return nil, err
			}
			replicas = append(replicas, c)
		}
		s.shards = append(s.shards, replicas)
	}
	return s, nil
}

func (s *store) nodes() []driver.Conn {
	var out []driver.Conn
	for _, shard := range s.shards {
		out = append(out, shard...)
	}
	return out
}

func (s *store) close() {
	for _, c := range s.nodes() {
		c.Close()
	}
}

// applySchema applies the migrations until done: to CLICKHOUSE_ADDR, or in
// cluster form to every node. ready is called once the tables can be used:
// in cluster mode as soon as every shard has a migrated replica, while a
// replica that is down is migrated when it is back.
func (s *store) applySchema(ctx context.Context, ready func()) {
	if s.cfg.Cluster.Enabled() {
		schema.ApplyClusterUntilDone(ctx, s.shards, s.cfg.Database, s.cfg.Cluster.Name, s.log, ready)
		return
	}
	if schema.ApplyUntilDone(ctx, s.conn, s.cfg.Database, s.log) {
		ready()
	}
}

// sink is the consumer's sink: one server, or each partition to its shard.
func (s *store) sink(obs chsink.Observer) (consumer.Sink, error) {
	if s.cfg.Cluster.Enabled() {
		return chsink.NewSharded(s.shards, s.cfg.Database, obs)
	}
	return chsink.New(s.conn, s.cfg.Database, obs)
}

// ping is the consumer's readiness check of ClickHouse: the server, or in
// cluster mode a replica of every shard (one replica down is not an
// outage). The replicas are asked at once, so that one that does not answer
// (a dial that hangs until ctx ends) cannot hide a sibling that does.
func (s *store) ping(ctx context.Context) error {
	if !s.cfg.Cluster.Enabled() {
		return s.conn.Ping(ctx)
	}
	errs := make([][]error, len(s.shards))
	var wg sync.WaitGroup
	for i, shard := range s.shards {
		errs[i] = make([]error, len(shard))
		for j, c := range shard {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i][j] = c.Ping(ctx) }()
		}
	}
	wg.Wait()
	var down []error
	for i, shardErrs := range errs {
		var failed []error
		for j, err := range shardErrs {
			if err != nil {
				failed = append(failed, fmt.Errorf("replica %d: %w", j+1, err))
			}
		}
		if len(failed) == len(shardErrs) {
			down = append(down, fmt.Errorf("shard %d: %w", i+1, errors.Join(failed...)))
		}
	}
	return errors.Join(down...)
}
