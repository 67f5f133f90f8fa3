package main

import "github.com/ratewarden/ratewarden/internal/cli"

// program is the API's words: none (it serves), help, and billing's
// verbs; internal/cli refuses any other word with usage and exit 2 before
// anything starts.
func program() cli.Program {
	return cli.Program{
		Name: "usage-api",
		Doc: `Serves customers' usage from the ClickHouse rollups (JSON API and the
dashboard at /) until SIGTERM or SIGINT. It takes no arguments: its
configuration is read from the environment (docs/reference.md, "usage-api").`,
		Serve: serve,
		Commands: []cli.Command{
			{Name: "statement", Args: "(KEY | --account ACCOUNT) --period YYYY-MM [--tz ZONE] [--verify] [--json]",
				Summary: "a key's (or an account's) statement for a month, from CLICKHOUSE_* (docs/billing.md)", Run: runStatement},
			{Name: "correct", Args: "--id ID --key KEY --reason TEXT (--event-id E | --from T --to T | --requests N --cost N) [--json]",
				Summary: "void an event or a range, or credit/debit a key: an event on the decisions log (docs/billing.md)", Run: runCorrect},
			{Name: "export", Args: "--period YYYY-MM [--tz ZONE] [--keys K,...] (--csv FILE | --json FILE | --stripe [--hourly])",
				Summary: "a final month's statements to a file, or their totals (the open month's hourly) to Stripe meter events, resumable (docs/billing.md)", Run: runExport},
		},
	}
}
