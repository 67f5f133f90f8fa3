package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed fleet.lua
var fleetLua string

var fleetScript = redis.NewScript(fleetLua)

// FleetKey is the sorted set of live limiter instances sharing this store
// and prefix.
func (s *Store) FleetKey() string { return s.prefix + ":fleet" }

// Beat records that member is alive (on Redis's clock), forgets members
// silent for longer than ttl, and returns how many are alive. One round trip.
func (s *Store) Beat(ctx context.Context, member string, ttl time.Duration) (int, error) {
	return s.fleet(ctx, member, ttl, "beat")
}

// Leave removes member at once (a graceful shutdown), and returns how many
// are left.
func (s *Store) Leave(ctx context.Context, member string, ttl time.Duration) (int, error) {
	return s.fleet(ctx, member, ttl, "leave")
}

func (s *Store) fleet(ctx context.Context, member string, ttl time.Duration, op string) (int, error) {
	n, err := fleetScript.Run(ctx, s.rdb, []string{s.FleetKey()}, member, max(1, ttl.Milliseconds()), op).Int64()
	if err != nil {
		return 0, fmt.Errorf("fleet %s %s: %w", op, s.FleetKey(), err)
	}
	return int(n), nil
}
