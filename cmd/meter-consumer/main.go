// Command meter-consumer reads decision events from Kafka (consumer group
// "meter") and writes them into ClickHouse: raw decisions and per-minute,
// per-hour and per-day rollups, with exact totals (see README.md,
// "Metering: exact totals"). Configuration is read from the environment
// (docs/reference.md, "meter-consumer"); logs are JSON on stderr.
package main

import (
	"os"

	"github.com/ratewarden/ratewarden/internal/lifecycle"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the consumer until SIGTERM or SIGINT and returns the exit code.
func serve() int { return lifecycle.Main("meter-consumer", loadConfig, run) }
