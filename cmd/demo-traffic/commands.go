package main

import "github.com/ratewarden/ratewarden/internal/cli"

// program is demo-traffic's words: none (it sends) or help; internal/cli
// refuses any other word with usage and exit 2.
func program() cli.Program {
	return cli.Program{
		Name: "demo-traffic",
		Doc: `Sends a small, steady mix of POST /check requests to a limiter (the local
stack's demo traffic) until SIGTERM or SIGINT. It takes no arguments:
DEMO_LIMITER_URL, DEMO_RPS and LIMITER_AUTH_TOKEN configure it.`,
		Serve: serve,
	}
}
