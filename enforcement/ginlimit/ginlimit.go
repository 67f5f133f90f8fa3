// Package ginlimit adapts the limiter's HTTP guard to gin.
package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/enforcement/httpapi"
)

// Middleware rate-limits every request that reaches it with g: the
// rate-limit header fields g.Headers selects on every response (the legacy
// trio and the IETF draft's RateLimit-Policy and RateLimit by default), 429
// with Retry-After on rejection.
// When g.Scope is nil the scope is gin's route template (c.FullPath()).
func Middleware(g *httpapi.Guard) gin.HandlerFunc {
	guard := *g
	return func(c *gin.Context) {
		if guard.Scope == nil {
			if p := c.FullPath(); p != "" {
				c.Request.Pattern = c.Request.Method + " " + p
			}
		}
		if !guard.Allow(c.Writer, c.Request) {
			c.Abort()
			return
		}
		c.Next()
	}
}
