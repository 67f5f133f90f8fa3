// Command limiter answers POST /check for any service: a two-tier token
// bucket with Redis (or Redis Cluster) as the authority. Configuration is
// read from the environment (README.md, "Configuration"); `limiter policy
// check|explain|replay` are the operator's policy tools, and `limiter help`
// lists every command (commands.go).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratewarden/ratewarden/internal/redislog"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the limiter until SIGTERM or SIGINT and returns the exit code.
func serve() int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	redislog.Use(log) // go-redis's own lines as JSON too, like every other log line
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "limiter: invalid configuration: "+err.Error())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("limiter stopped", "err", err)
		return 1
	}
	return 0
}
