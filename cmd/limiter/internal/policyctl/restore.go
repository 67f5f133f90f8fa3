package policyctl

// `limiter policy restore`: a lost policy log written back as a new epoch
// (policylog/epoch.go), from policy_audit or from a limiter's cache file.

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/schema"
)

const restoreUsage = `usage:
  limiter policy restore (--from-audit [--at RFC3339] | --from-cache DIR) -m MESSAGE [--author A] [--json]
  --from-audit reads ClickHouse's policy_audit (CLICKHOUSE_*): the state in force at --at (default now);
  --from-cache reads a limiter's POLICY_CACHE_DIR. The state is written as one epoch record; limiters
  that kept the lost revision apply it once it restores at least that revision.`

func policyRestore(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy restore", restoreUsage, stdout, stderr)
	fromAudit := f.Bool("from-audit", false, "restore the state policy_audit holds")
	fromCache := f.String("from-cache", "", "restore the state of the cache file in this POLICY_CACHE_DIR")
	at := f.String("at", "", "with --from-audit: the state in force at this instant (RFC3339; default now)")
	message := f.String("m", "", "message (why; required)")
	author := f.String("author", defaultAuthor(), "author")
	asJSON := f.Bool("json", false, "print the outcome as JSON")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.args) != 0 || *fromAudit == (*fromCache != "") || *message == "" || (*at != "" && !*fromAudit) {
		fmt.Fprintln(stderr, restoreUsage)
		return 2
	}
	when := time.Now()
	if *at != "" {
		t, err := time.Parse(time.RFC3339, *at)
		if err != nil {
			fmt.Fprintf(stderr, "--at %q is not an RFC3339 instant\n%s\n", *at, restoreUsage)
			return 2
		}
		when = t
	}
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	var from *policylog.State
	if *fromCache != "" {
		topic := envconfig.New(os.Getenv).String("POLICY_TOPIC", kafkalog.DefaultTopic)
		st, err := policylog.CacheState(*fromCache, topic)
		if err != nil {
			fmt.Fprintln(stderr, "restore: "+err.Error())
			return 1
		}
		from = st
	} else {
		env := envconfig.New(os.Getenv)
		ch := chconn.FromEnv(env, schema.ValidDatabase)
		if err := env.Err(); err != nil {
			fmt.Fprintln(stderr, "limiter: invalid configuration: "+err.Error())
			return 2
		}
		conn, err := ch.Open(chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: time.Minute})
		if err != nil {
			fmt.Fprintln(stderr, "restore: ClickHouse: "+err.Error())
			return 1
		}
		defer conn.Close()
		st, _, err := chaudit.InForceRecords(ctx, conn, ch.Database, when)
		if err != nil {
			fmt.Fprintln(stderr, "restore: "+err.Error())
			return 1
		}
		from = st
	}
	if from.Head() == 0 {
		fmt.Fprintln(stderr, "restore: the source holds no policy document: nothing to restore")
		return 1
	}
	return withLog(stderr, true, func(ctx context.Context, c *policylog.Client) int {
		o, err := c.Restore(ctx, from, *author, *message)
		code := report(o, err, *asJSON, stdout, stderr)
		if code == 0 && !*asJSON {
			fmt.Fprintf(stdout, "epoch %d: revision %d restored with %d overrides, digest %s\n", c.State().Epoch(), c.State().Head(), c.State().Overrides(), c.State().Digest())
		}
		return code
	})
}

// lostLog reports (and prints why) that the log is empty although
// policy_audit holds an earlier log's history (chaudit.LostLog), when
// ClickHouse can be reached with the CLICKHOUSE_* variables.
func lostLog(ctx context.Context, c *policylog.Client, stderr io.Writer) bool {
	if c.State().NextOffset() != 0 {
		return false
	}
	env := envconfig.New(os.Getenv)
	ch := chconn.FromEnv(env, schema.ValidDatabase)
	if env.Err() != nil {
		return false
	}
	conn, err := ch.Open(chconn.Tuning{DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
	if err != nil {
		return false
	}
	defer conn.Close()
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	why, lost := chaudit.LostLog(qctx, conn, ch.Database, c.State())
	if lost {
		fmt.Fprintln(stderr, "refused: "+why)
	}
	return lost
}
