package main

import "github.com/ratewarden/ratewarden/internal/cli"

// program is wan-dev's words: none (it serves) or help.
func program() cli.Program {
	return cli.Program{
		Name: "wan-dev",
		Doc: `Serves the WAN links of the multi-region test bed (make regions-up) until
SIGTERM or SIGINT: per link a loopback listener forwarding to its target with
a one-way delay, jitter and loss, and a loopback control endpoint that cuts
and heals links by region. It takes no arguments: WAN_DEV_LINKS,
WAN_DEV_JITTER, WAN_DEV_LOSS, WAN_DEV_CUT and WAN_DEV_CONTROL_ADDR configure
it (see the package comment).`,
		Serve: serve,
	}
}
