package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// A script that spends tokens (or gives them back) must run at most once
// per decision: a call whose bytes may have reached Redis may also have run
// there, whatever the client saw (a read timeout on a server that was
// only slow, a connection reset after the reply was computed), and sending
// it again would charge the bucket a second time for one decision. So
// every spending script goes through go-redis as a command that says
// NoRetry: the client's retries on network errors and timeouts (MaxRetries,
// and a ClusterClient's retry loop, bounded by MaxRedirects) leave it
// alone, while a ClusterClient still follows MOVED and ASK and a node
// still answers READONLY — refusals Redis gives before the script runs,
// after which sending it elsewhere is its first run. NOSCRIPT is such a
// refusal too: the script is sent again as EVAL.
//
// The full-duplex connection (duplex.go) never sends a call twice: a
// connection that fails or stalls fails every call on it.

// spendScript is a spending script: its SHA1 (EVALSHA) and its source
// (EVAL after NOSCRIPT).
type spendScript struct {
	*redis.Script
	src string
}

func newSpendScript(src string) spendScript {
	return spendScript{Script: redis.NewScript(src), src: src}
}

// noRetryCmd is a command go-redis must never send a second time after a
// network error.
type noRetryCmd struct{ *redis.Cmd }

// NoRetry implements redis.Cmder.
func (noRetryCmd) NoRetry() bool { return true }

// processor is what every go-redis client (Client, ClusterClient, Ring,
// Pipeliner) has beside redis.Scripter.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run is EVALSHA of s over keys and args, then EVAL on NOSCRIPT, each sent
// at most once.
func (s spendScript) run(ctx context.Context, rdb redis.Scripter, keys []string, args ...any) *redis.Cmd {
	p, ok := rdb.(processor)
	if !ok {
		// Not a go-redis client (none of redisstore's callers): its
		// own retry rules apply.
		return s.Script.Run(ctx, rdb, keys, args...)
	}
	cmd := s.send(ctx, p, "evalsha", s.Hash(), keys, args)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = s.send(ctx, p, "eval", s.src, keys, args)
	}
	return cmd
}

func (s spendScript) send(ctx context.Context, p processor, name, body string, keys []string, args []any) *redis.Cmd {
	full := make([]any, 0, 3+len(keys)+len(args))
	full = append(full, name, body, len(keys))
	for _, k := range keys {
		full = append(full, k)
	}
	full = append(full, args...)
	cmd := redis.NewCmd(ctx, full...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3) // the Cluster routes by the first key
	}
	_ = p.Process(ctx, noRetryCmd{cmd})
	return cmd
}
