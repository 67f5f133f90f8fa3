// Command usage-api serves customers' usage from the ClickHouse rollups: a
// JSON API (admin bearer token, signed portal tokens) and the dashboard page
// at /. Configuration is read from the environment (docs/reference.md,
// "usage-api"); logs are JSON on stderr; SIGTERM/SIGINT shut it down
// gracefully (in-flight requests finish, within 10 s).
package main

import (
	"os"
	_ "time/tzdata" // tz= works on machines without a zoneinfo package

	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/internal/lifecycle"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the API until SIGTERM or SIGINT and returns the exit code.
func serve() int {
	gin.SetMode(gin.ReleaseMode)
	return lifecycle.Main("usage-api", loadConfig, run)
}
