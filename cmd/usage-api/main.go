// Command usage-api serves customers' usage from the ClickHouse rollups: a
// JSON API (admin bearer token, signed portal tokens) and the dashboard page
// at /. Configuration is read from the environment (CONTRACT.md,
// "usage-api"); logs are JSON on stderr; SIGTERM/SIGINT shut it down
// gracefully (in-flight requests finish, at most 10 s).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // tz= works on machines without a zoneinfo package

	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/internal/redislog"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the API until SIGTERM or SIGINT and returns the exit code.
func serve() int {
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage-api: invalid configuration:", err)
		return 2
	}
	gin.SetMode(gin.ReleaseMode)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	redislog.Use(log) // go-redis's own lines (quota reads from Redis) as JSON too
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("usage-api failed", "err", err)
		return 1
	}
	return 0
}
