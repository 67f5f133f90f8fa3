package policyctl

// `limiter policy checkpoint`: a signed checkpoint of the policy log
// (policylog/checkpoint.go), so that a reader that starts without a cache
// checks the signatures written since, not every one.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/ratewarden/ratewarden/policylog"
)

const checkpointUsage = `usage:
  limiter policy checkpoint [-m MESSAGE] [--author A] [--json]
  Reads the whole policy log, checking every signature (POLICY_TRUSTED_KEYS_FILE), and writes a
  checkpoint signed with POLICY_SIGNING_KEY_FILE: readers that start from the log's beginning then
  apply the records below it without checking each signature, once its state digest matches.
  Writers also write one every 1000 records by themselves.`

func policyCheckpoint(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy checkpoint", checkpointUsage, stdout, stderr)
	message := f.String("m", "checkpoint", "message")
	author := f.String("author", defaultAuthor(), "author")
	asJSON := f.Bool("json", false, "print the checkpoint as JSON")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.args) != 0 {
		fmt.Fprintln(stderr, checkpointUsage)
		return 2
	}
	return withLog(stderr, false, func(ctx context.Context, c *policylog.Client) int {
		o, err := c.Checkpoint(ctx, *author, *message)
		if err != nil {
			fmt.Fprintln(stderr, "policy log: "+err.Error())
			return 1
		}
		cp := o.Record.Checkpoint
		if *asJSON {
			_ = json.NewEncoder(stdout).Encode(map[string]any{"revision": o.Record.Revision, "epoch": cp.Epoch,
				"through": cp.Through, "digest": cp.Digest, "forged": len(cp.Forged)})
			return 0
		}
		fmt.Fprintf(stdout, "checkpoint: revision %d (epoch %d), the records below offset %d vouched for (%d whose signature does not hold), digest %s\n",
			o.Record.Revision, cp.Epoch, cp.Through, len(cp.Forged), cp.Digest)
		return 0
	})
}
