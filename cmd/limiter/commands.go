package main

import (
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/policyctl"
	"github.com/ratewarden/ratewarden/internal/cli"
)

// program is the limiter's words. With none it serves; every other word
// must be in this table (internal/cli refuses the rest with usage and exit
// 2 before anything starts). A new verb is one entry; the usage text is
// generated from the table. The verbs live in cmd/limiter/internal/policyctl, one
// function per entry.
func program() cli.Program {
	return cli.Program{
		Name: "limiter",
		Doc: `With no arguments the limiter serves POST /check (and the Envoy rate limit
service) with its configuration read from the environment: docs/reference.md,
"limiter". It takes no flags.`,
		Commands: []cli.Command{
			{Name: "policy", Summary: "the operator's policy tools", Sub: []cli.Command{
				{Name: "check", Args: "FILE", Run: policyctl.Check,
					Summary: "validate a policy file as the limiter loads it"},
				{Name: "explain", Args: "FILE (--key K --scope S [--tier T] | --domain D --descriptor K=V ...)", Run: policyctl.Explain,
					Summary: "which rule limits a key and scope (or an Envoy descriptor), and why"},
				{Name: "replay", Args: "[FILE] (--from T --to T | --since D) [flags]", Run: policyctl.Replay,
					Summary: "recorded decisions (ClickHouse) decided again under a candidate policy (default: the one in force, from policy_audit)"},
				{Name: "push", Args: "FILE -m MESSAGE [--author A] [--expect-revision N] [--json] [--no-replay] [flags]", Run: policyctl.Push,
					Summary: "append a policy document to the policy log, after printing what it would newly reject of the last hour's traffic; exits 0 once it is applied"},
				{Name: "rollback", Args: "REVISION -m MESSAGE [--author A] [--json]", Run: policyctl.Rollback,
					Summary: "put an earlier revision's document back in force, as a new revision"},
				{Name: "history", Args: "[--limit N] [--json]", Run: policyctl.History,
					Summary: "the policy log's records, applied and refused, newest first"},
				{Name: "show", Args: "[REVISION]", Run: policyctl.Show,
					Summary: "the document in force (or at REVISION)"},
				{Name: "diff", Args: "REVISION_A REVISION_B", Run: policyctl.Diff,
					Summary: "what changed between two revisions"},
				{Name: "restore", Args: "(--from-audit [--at T] | --from-cache DIR) -m MESSAGE [--author A] [--json]", Run: policyctl.Restore,
					Summary: "write a lost policy log's state back as a new epoch, from policy_audit or a limiter's cache"},
				{Name: "checkpoint", Args: "[-m MESSAGE] [--author A] [--json]", Run: policyctl.Checkpoint,
					Summary: "sign a checkpoint of the policy log, so that a reader starting without a cache checks only the signatures written since"},
				{Name: "keygen", Args: "IDENTITY --out FILE", Run: policyctl.Keygen,
					Summary: "a new writer's signing key, and its keyring line"},
			}},
			{Name: "override", Summary: "per-key overrides on the policy log", Sub: []cli.Command{
				{Name: "set", Args: "KEY [--scope S] [--tier T | --rate R --burst B [--period P]] [flags] --reason TEXT", Run: policyctl.OverrideSet,
					Summary: "set a key's (or key and scope's) override, ahead of every rule"},
				{Name: "get", Args: "KEY [--scope S] [--json]", Run: policyctl.OverrideGet,
					Summary: "the override in force for a key (and scope)"},
				{Name: "list", Args: "[--json]", Run: policyctl.OverrideList,
					Summary: "every override in force"},
				{Name: "delete", Args: "KEY [--scope S] --reason TEXT", Run: policyctl.OverrideDelete,
					Summary: "remove an override (a tombstone on the log)"},
			}},
			{Name: "key", Summary: "one key, seen whole and set right (docs/support.md)", Sub: []cli.Command{
				{Name: "inspect", Args: "KEY --scope S [--limiters URL,URL...] [--json]", Run: keyInspect,
					Summary: "everything that decides the key's next answer, read at one moment"},
				{Name: "reset", Args: "KEY --scope S (--refill | --grant N | --clear-debt | --quota) --reason TEXT [--json]", Run: keyReset,
					Summary: "set the key right in the store, signed and audited; every limiter drops its local view"},
			}},
			{Name: "fleet", Summary: "the limiters that share the policy log", Sub: []cli.Command{
				{Name: "status", Args: "[--limiters URL,URL...] [--json]", Run: policyctl.FleetStatus,
					Summary: "the revision each limiter applied, beside the log's head"},
			}},
		},
		Serve: serve,
	}
}
