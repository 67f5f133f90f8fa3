package usage

import (
	"embed"
	"io/fs"
	"net/http"

	"github.com/gin-gonic/gin"
)

// The dashboard is static: index.html, app.js, app.css, the support page and the vendored uPlot
// (web/vendor, MIT, see web/vendor/uPlot.LICENSE). It calls the JSON API with
// the pasted portal token in the Authorization header, never in a URL.
//
//go:embed web
var webFS embed.FS

func mountDashboard(r *gin.Engine) {
	sub, err := fs.Sub(webFS, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServer(http.FS(sub))
	serve := func(c *gin.Context) {
		c.Header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		c.Header("X-Content-Type-Options", "nosniff")
		c.Header("Referrer-Policy", "no-referrer")
		files.ServeHTTP(c.Writer, c.Request)
	}
	r.GET("/", serve)
	// The support page (support.html, support.js): find, inspect and
	// reset a key with an operator's token; its API is the usage API
	// binary's (the support package), not this server's.
	r.GET("/support", func(c *gin.Context) {
		c.Request.URL.Path = "/support.html"
		serve(c)
	})
	r.GET("/assets/*path", func(c *gin.Context) {
		c.Request.URL.Path = "/" + c.Param("path")[1:]
		if c.Request.URL.Path == "/" {
			c.Status(http.StatusNotFound)
			return
		}
		serve(c)
	})
}
