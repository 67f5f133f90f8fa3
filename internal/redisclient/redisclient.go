// Package redisclient builds the go-redis client of the accounting-side
// binaries (meter-consumer's reconciler, usage-api) from REDIS_ADDRS the way
// the limiter reads it: one address is a standalone server, several are the
// seed nodes of a Redis Cluster.
package redisclient

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// New returns a client for addrs (len(addrs) ≥ 1). timeout bounds dialing,
// reads and writes; callers still put a deadline on every call
// (ContextTimeoutEnabled makes go-redis honour it).
func New(addrs []string, password string, timeout time.Duration) redis.UniversalClient {
	if len(addrs) == 1 {
		return redis.NewClient(&redis.Options{
			Addr: addrs[0], Password: password,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
			ContextTimeoutEnabled: true, PoolSize: 16,
		})
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: addrs, Password: password,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
		ContextTimeoutEnabled: true, PoolSize: 16,
	})
}
