package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
)

type fixed enforcement.Decision

func (f fixed) Check(context.Context, enforcement.Request) (enforcement.Decision, error) {
	return enforcement.Decision(f), nil
}

// A decision at or above the soft limit reaches the caller as
// RateLimit-Warning: soft-limit, allowed or not; below it, no header.
func TestSoftLimitWarningHeader(t *testing.T) {
	for _, c := range []struct {
		d    enforcement.Decision
		want string
	}{
		{enforcement.Decision{Allowed: true, WouldAllow: true, Warning: true, Limit: 10, Remaining: 1}, "soft-limit"},
		{enforcement.Decision{Allowed: false, Warning: true, Limit: 10, RetryAfter: time.Second}, "soft-limit"},
		{enforcement.Decision{Allowed: true, WouldAllow: true, Limit: 10, Remaining: 9}, ""},
	} {
		c.d.ResetAt = time.Now().Add(time.Second)
		g := &httpapi.Guard{Checker: fixed(c.d), Key: httpapi.HeaderKey("X-API-Key", "key:")}
		w := httptest.NewRecorder()
		httpapi.Middleware(g)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if got := w.Header().Get(httpapi.WarningHeader); got != c.want {
			t.Errorf("warning=%v allowed=%v: %s = %q, want %q", c.d.Warning, c.d.Allowed, httpapi.WarningHeader, got, c.want)
		}
	}
}
