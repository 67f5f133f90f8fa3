package main

import "github.com/ratewarden/ratewarden/internal/cli"

// program is the consumer's words: none (it serves) or help; internal/cli
// refuses any other word with usage and exit 2 before anything starts.
func program() cli.Program {
	return cli.Program{
		Name: "meter-consumer",
		Doc: `Reads decision events from Kafka (consumer group "meter") and writes them
into ClickHouse with exact totals, until SIGTERM or SIGINT. It takes no
arguments: its configuration is read from the environment (docs/reference.md,
"meter-consumer"; docs/metering.md).`,
		Serve: serve,
	}
}
