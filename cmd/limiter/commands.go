package main

import (
	"io"

	"github.com/ratewarden/ratewarden/internal/cli"
)

// program is the limiter's words. With none it serves; every other word
// must be in this table (internal/cli refuses the rest with usage and exit
// 2 before anything starts). A new verb is one entry; the usage text is
// generated from the table.
func program() cli.Program {
	return cli.Program{
		Name: "limiter",
		Doc: `With no arguments the limiter serves POST /check (and the Envoy rate limit
service) with its configuration read from the environment: docs/reference.md,
"limiter". It takes no flags.`,
		Commands: []cli.Command{
			{Name: "policy", Summary: "the operator's policy tools", Sub: []cli.Command{
				{Name: "check", Args: "FILE", Run: policyCheck,
					Summary: "validate a policy file as the limiter loads it"},
				{Name: "explain", Args: "FILE (--key K --scope S [--tier T] | --domain D --descriptor K=V ...)", Run: policyExplain,
					Summary: "which rule limits a key and scope (or an Envoy descriptor), and why"},
				{Name: "replay", Args: "[FILE] (--from T --to T | --since D) [flags]", Run: replayCommand,
					Summary: "recorded decisions (ClickHouse) decided again under a candidate policy (default: the one in force, from policy_audit)"},
				{Name: "push", Args: "FILE -m MESSAGE [--author A] [--expect-revision N] [--json] [--no-replay] [flags]", Run: verb(policyLogCommand, "push"),
					Summary: "append a policy document to the policy log, after printing what it would newly reject of the last hour's traffic; exits 0 once it is applied"},
				{Name: "rollback", Args: "REVISION -m MESSAGE [--author A] [--json]", Run: verb(policyLogCommand, "rollback"),
					Summary: "put an earlier revision's document back in force, as a new revision"},
				{Name: "history", Args: "[--limit N] [--json]", Run: verb(policyLogCommand, "history"),
					Summary: "the policy log's records, applied and refused, newest first"},
				{Name: "show", Args: "[REVISION]", Run: verb(policyLogCommand, "show"),
					Summary: "the document in force (or at REVISION)"},
				{Name: "diff", Args: "REVISION_A REVISION_B", Run: verb(policyLogCommand, "diff"),
					Summary: "what changed between two revisions"},
				{Name: "restore", Args: "(--from-audit [--at T] | --from-cache DIR) -m MESSAGE [--author A] [--json]", Run: policyRestore,
					Summary: "write a lost policy log's state back as a new epoch, from policy_audit or a limiter's cache"},
				{Name: "keygen", Args: "IDENTITY --out FILE", Run: policyKeygen,
					Summary: "a new writer's signing key, and its keyring line"},
			}},
			{Name: "override", Summary: "per-key overrides on the policy log", Sub: []cli.Command{
				{Name: "set", Args: "KEY [--scope S] [--tier T | --rate R --burst B [--period P]] [flags] --reason TEXT", Run: verb(overrideCommand, "set"),
					Summary: "set a key's (or key and scope's) override, ahead of every rule"},
				{Name: "get", Args: "KEY [--scope S] [--json]", Run: verb(overrideCommand, "get"),
					Summary: "the override in force for a key (and scope)"},
				{Name: "list", Args: "[--json]", Run: verb(overrideCommand, "list"),
					Summary: "every override in force"},
				{Name: "delete", Args: "KEY [--scope S] --reason TEXT", Run: verb(overrideCommand, "delete"),
					Summary: "remove an override (a tombstone on the log)"},
			}},
			{Name: "fleet", Summary: "the limiters that share the policy log", Sub: []cli.Command{
				{Name: "status", Args: "[--limiters URL,URL...] [--json]", Run: verb(fleetCommand, "status"),
					Summary: "the revision each limiter applied, beside the log's head"},
			}},
		},
		Serve: serve,
	}
}

// verb adapts a command that serves several verbs to the table entry of
// one of them, which is handed the words after the verb.
func verb(run func(verb string, args []string, stdout, stderr io.Writer) int, name string) func([]string, io.Writer, io.Writer) int {
	return func(args []string, stdout, stderr io.Writer) int {
		return run(name, args, stdout, stderr)
	}
}
