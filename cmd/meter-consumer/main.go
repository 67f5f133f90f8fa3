// Command meter-consumer reads decision events from Kafka (consumer group
// "meter") and writes them into ClickHouse: raw decisions and per-minute,
// per-hour and per-day rollups, with exact totals (see README.md,
// "Metering: exact totals"). Configuration is read from the environment
// (CONTRACT.md, "meter-consumer"); logs are JSON on stderr.
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

// serve runs the consumer until SIGTERM or SIGINT and returns the exit code.
func serve() int {
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "meter-consumer: invalid configuration:", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	redislog.Use(log) // go-redis's own lines (the quota reconciler's Redis) as JSON too, like every other log line
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("meter-consumer failed", "err", err)
		return 1
	}
	return 0
}
