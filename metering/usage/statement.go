package usage

import (
	"context"
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/metering/billing"
)

// StatementFunc answers a key's statement for period ("YYYY-MM") in zone
// tz ("" = UTC): billing.Statements.Get, wired by cmd/usage-api. An error
// wrapping billing.ErrInvalid is the request's fault (400).
type StatementFunc func(ctx context.Context, key, period, tz string) (any, error)

var statementParamNames = map[string]bool{"key": true, "period": true, "tz": true}

// getStatement is GET /v1/statement: a portal token reads its own key's
// statement (the dashboard's "This month" and "Last month"); the admin
// names key=. The operator's fuller route, with verify, is
// /v1/admin/statements/{key} (docs/billing.md).
func (s *Server) getStatement(c *gin.Context) {
	if s.cfg.Statement == nil {
		c.Header("Retry-After", "60")
		fail(c, http.StatusServiceUnavailable, "unavailable", "statements are not configured on this server")
		return
	}
	var p problems
	single := singles(c.Request.URL.Query(), statementParamNames, &p)
	if err := p.err(); err != nil {
		fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	key, ok := resolveKey(c, single["key"])
	if !ok {
		return
	}
	period := single["period"]
	if period == "" {
		loc, err := billing.ParsePeriod("2026-01", single["tz"]) // the zone alone; the month is replaced below
		if err != nil {
			fail(c, http.StatusBadRequest, "invalid_request", err.Error())
			return
		}
		period = billing.PeriodOf(s.now(), loc.Loc).String()
	}
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	st, err := s.cfg.Statement(ctx, key, period, single["tz"])
	switch {
	case errors.Is(err, billing.ErrInvalid):
		fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	case errors.Is(err, billing.ErrUnavailable):
		s.storeFail(c, ErrUnavailable)
		return
	case err != nil:
		s.storeFail(c, err)
		return
	}
	c.JSON(http.StatusOK, st)
}
