// Command limiter answers POST /check for any service: a two-tier token
// bucket with Redis (or Redis Cluster) as the authority. Configuration is
// read from the environment (README.md, "Configuration"); `limiter policy
// check|explain` are the operator's policy tools.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratewarden/ratewarden/internal/redislog"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "policy" {
		os.Exit(policyCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && (os.Args[1] == "override" || os.Args[1] == "fleet") { // policylog_cmd.go
		cmd := map[string]func([]string, io.Writer, io.Writer) int{"override": overrideCommand, "fleet": fleetCommand}[os.Args[1]]
		os.Exit(cmd(os.Args[2:], os.Stdout, os.Stderr))
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	redislog.Use(log) // go-redis's own lines as JSON too, like every other log line
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "limiter: invalid configuration: "+err.Error())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("limiter stopped", "err", err)
		os.Exit(1)
	}
}
