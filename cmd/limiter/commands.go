package main

import "github.com/ratewarden/ratewarden/internal/cli"

// program is the limiter's words. With none it serves; every other word
// must be in this table (internal/cli refuses the rest with usage and exit
// 2 before anything starts). A new verb is one entry; the usage text is
// generated from the table.
func program() cli.Program {
	return cli.Program{
		Name: "limiter",
		Doc: `With no arguments the limiter serves POST /check (and the Envoy rate limit
service) with its configuration read from the environment: README.md,
"Configuration of the limiter". It takes no flags.`,
		Commands: []cli.Command{
			{Name: "policy", Summary: "the operator's policy tools", Sub: []cli.Command{
				{Name: "check", Args: "FILE", Run: policyCheck,
					Summary: "validate a policy file as the limiter loads it"},
				{Name: "explain", Args: "FILE (--key K --scope S [--tier T] | --domain D --descriptor K=V ...)", Run: policyExplain,
					Summary: "which rule limits a key and scope (or an Envoy descriptor), and why"},
				{Name: "replay", Args: "FILE (--from T --to T | --since D) [flags]", Run: replayCommand,
					Summary: "recorded decisions (ClickHouse) decided again under a candidate policy"},
			}},
		},
		Serve: serve,
	}
}
