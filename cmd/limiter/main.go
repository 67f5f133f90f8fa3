// Command limiter answers POST /check for any service: a two-tier token
// bucket with Redis (or Redis Cluster) as the authority. Configuration is
// read from the environment (docs/reference.md, "limiter"); `limiter policy
// check|explain|replay` are the operator's policy tools, and `limiter help`
// lists every command (commands.go).
package main

import (
	"os"

	"github.com/ratewarden/ratewarden/internal/lifecycle"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the limiter until SIGTERM or SIGINT and returns the exit code.
func serve() int { return lifecycle.Main("limiter", loadConfig, run) }
