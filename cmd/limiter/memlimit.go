package main

import (
	"log/slog"
	"os"

	"github.com/ratewarden/ratewarden/internal/memlimit"
)

// applyMemoryLimit gives the runtime a soft memory limit of 90% of the
// container's, unless GOMEMLIMIT is set (internal/memlimit), and logs what
// was chosen. A limit that cannot be read is a warning: the limiter runs
// as it would without one.
func applyMemoryLimit(log *slog.Logger) memlimit.Choice {
	c, err := memlimit.Apply(os.DirFS("/"), os.Getenv)
	switch {
	case err != nil:
		log.Warn("could not read the container's memory limit; no GOMEMLIMIT set", "err", err)
	case c.Source == "GOMEMLIMIT":
		log.Info("memory limit", "gomemlimit", os.Getenv("GOMEMLIMIT"), "source", "GOMEMLIMIT", "container_bytes", c.Container)
	case c.Limit > 0:
		log.Info("memory limit", "gomemlimit_bytes", c.Limit, "source", c.Source, "container_bytes", c.Container)
	default:
		log.Info("memory limit", "gomemlimit", "off", "source", "no container limit visible")
	}
	return c
}
