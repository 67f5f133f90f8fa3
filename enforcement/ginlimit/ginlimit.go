// Package ginlimit adapts the limiter's HTTP guard to gin.
package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/enforcement/httpapi"
)

// Middleware rate-limits every request that reaches it with g: the
// rate-limit header fields g.Headers selects on every response (the legacy
// trio and the IETF draft's RateLimit-Policy and RateLimit by default), 429
// with Retry-After on rejection. A request on a concurrency limit holds its
// slot while the handlers after it run, renewed as they run, and gives it
// back when they return or panic (httpapi.Guard.Hold).
// When g.Scope is nil the scope is gin's route template (c.FullPath()).
func Middleware(g *httpapi.Guard) gin.HandlerFunc {
	guard := *g
	return func(c *gin.Context) {
		if guard.Scope == nil {
			if p := c.FullPath(); p != "" {
				c.Request.Pattern = c.Request.Method + " " + p
			}
		}
		r, done, ok := guard.Hold(c.Writer, c.Request)
		if !ok {
			c.Abort()
			return
		}
		c.Request = r
		defer done() // a concurrency limit's slot, given back also when a handler panics
		c.Next()
	}
}

// ReserveMiddleware is Middleware for costs known after the work
// (httpapi.ReserveMiddleware): it reserves the estimate before the
// handlers, and settles the actual cost they reported with
// httpapi.SetActualCost(c.Request.Context(), n) after them — also when
// one panics (the panic then goes on, to gin's recovery).
func ReserveMiddleware(g *httpapi.Guard, s httpapi.Settler) gin.HandlerFunc {
	guard := *g
	return func(c *gin.Context) {
		if guard.Scope == nil {
			if p := c.FullPath(); p != "" {
				c.Request.Pattern = c.Request.Method + " " + p
			}
		}
		r, settle, ok := guard.Reserve(c.Writer, c.Request, s)
		if !ok {
			c.Abort()
			return
		}
		c.Request = r
		defer settle()
		c.Next()
	}
}
