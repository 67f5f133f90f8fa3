package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/policy"

	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/promdecl"
)

// Config configures a Server. Zero values of optional fields are documented.
type Config struct {
	Store      *Store  // required
	Signer     *Signer // required
	AdminToken string  // required: the operator's bearer token
	PolicyPath string  // the limiter's policy file, for quotas; "" = no quotas known
	// Redis is the limiters' Redis or Cluster, read for what the quota
	// counters say is left; nil = the quota view shows the record only.
	Redis        redis.UniversalClient
	KeyPrefix    string        // REDIS_KEY_PREFIX of the limiters; "" = limits.DefaultKeyPrefix
	RedisTimeout time.Duration // bound on the Redis read of one request; 0 = 1 s
	Logger       *slog.Logger  // nil = discard
	// Registry receives the server's metrics and is served on /metrics;
	// nil = a fresh registry.
	Registry *prometheus.Registry
	// Now is the clock; nil = time.Now.
	Now func() time.Time
	// QueryTimeout bounds every ClickHouse call of one request; 0 = 10 s.
	QueryTimeout time.Duration
	// MaxTokenTTL caps ttl_seconds of new portal tokens; 0 = 30 days.
	MaxTokenTTL time.Duration
	// Statement answers GET /v1/statement (statement.go); nil = that route
	// answers 503.
	Statement StatementFunc
}

// Server is the usage API and dashboard. Its handler is safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	handler http.Handler
	admin   bearer.Checker // Config.AdminToken

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	policy    *policy.Current  // nil without Config.PolicyPath
	quotaRows *quotause.Reader // the rollups, read as the reconciler reads them
}

// New builds a Server from cfg.
func New(cfg Config) (*Server, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, errors.New("usage: Config.Store is required"))
	}
	if cfg.Signer == nil {
		errs = append(errs, errors.New("usage: Config.Signer is required"))
	}
	if cfg.AdminToken == "" {
		errs = append(errs, errors.New("usage: Config.AdminToken is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 10 * time.Second
	}
	if cfg.MaxTokenTTL == 0 {
		cfg.MaxTokenTTL = 30 * 24 * time.Hour
	}
	if cfg.RedisTimeout == 0 {
		cfg.RedisTimeout = time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, now: cfg.Now, admin: bearer.NewChecker(cfg.AdminToken)}
	s.policy = newPolicy(cfg.PolicyPath, s)
	rows, err := quotause.NewReader(cfg.Store.conn, cfg.Store.db)
	if err != nil {
		return nil, err
	}
	s.quotaRows = rows
	s.requests = promdecl.CounterVec("usage_api_requests_total", "HTTP requests answered, by route and status code.", "route", "code")
	s.latency = promdecl.HistogramVec("usage_api_request_duration_seconds", "HTTP request latency by route.", prometheus.ExponentialBuckets(0.001, 2, 14), "route")
	if err := cfg.Registry.Register(s.requests); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if err := cfg.Registry.Register(s.latency); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s.handler = s.routes()
	return s, nil
}

// Handler is the HTTP handler of every route.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(s.observe)
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", s.readyz)
	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{})))
	mountDashboard(r)

	v1 := r.Group("/v1", noStore)
	v1.GET("/usage", s.auth(false), s.getUsage)
	v1.GET("/quota", s.auth(false), s.getQuota)
	v1.GET("/statement", s.auth(false), s.getStatement)
	v1.GET("/slots", s.auth(false), s.getSlots) // slots.go
	admin := v1.Group("/admin", s.auth(true))
	admin.POST("/portal-tokens", s.postPortalToken)
	admin.DELETE("/portal-tokens/:id", s.deletePortalToken)
	admin.GET("/top-keys", s.getTopKeys)
	admin.GET("/webhook-deliveries", s.getDeliveries)
	r.NoRoute(func(c *gin.Context) { fail(c, http.StatusNotFound, "not_found", "no such route") })
	r.NoMethod(func(c *gin.Context) {
		fail(c, http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed on this route")
	})
	return r
}

func noStore(c *gin.Context) { c.Header("Cache-Control", "no-store") }

func (s *Server) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	s.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
	s.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	if c.Writer.Status() >= 500 {
		s.log.Warn("request failed", "method", c.Request.Method, "route", route, "status", c.Writer.Status(), "duration_ms", time.Since(start).Milliseconds())
	}
}

// fail writes the contract's error body.
func fail(c *gin.Context, status int, code, msg string) {
	if status == http.StatusUnauthorized {
		c.Header("WWW-Authenticate", `Bearer realm="usage"`)
	}
	c.AbortWithStatusJSON(status, gin.H{"error": gin.H{"code": code, "message": msg}})
}

// storeFail maps a store error to 503 (unavailable) or 500.
func (s *Server) storeFail(c *gin.Context, err error) {
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("clickhouse unavailable", "route", c.FullPath(), "err", err)
		c.Header("Retry-After", "5")
		fail(c, http.StatusServiceUnavailable, "store_unavailable", "usage data is temporarily unavailable (ClickHouse cannot be reached); retry shortly")
		return
	}
	s.log.Error("store error", "route", c.FullPath(), "err", err)
	fail(c, http.StatusInternalServerError, "internal", "internal error")
}

func (s *Server) queryCtx(c *gin.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Request.Context(), s.cfg.QueryTimeout)
}

func (s *Server) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
	defer cancel()
	if err := s.cfg.Store.Ready(ctx); err != nil {
		c.JSON(http.StatusServiceUnavailable, gin.H{"status": "unavailable", "reason": err.Error()})
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// identity is who a request acts as: the operator, or a portal token's key.
type identity struct {
	admin  bool
	key    string
	claims Claims
}

const identityKey = "usage.identity"

// auth authenticates the bearer token. adminOnly routes accept the admin
// token only; others accept it or a valid, unexpired, unrevoked portal token.
func (s *Server) auth(adminOnly bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		tok, ok := bearer.Token(c.GetHeader("Authorization"))
		if !ok {
			fail(c, http.StatusUnauthorized, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
			return
		}
		if s.admin.Equal(tok) {
			c.Set(identityKey, identity{admin: true})
			return
		}
		if adminOnly {
			fail(c, http.StatusUnauthorized, "unauthorized", "this endpoint needs the admin token")
			return
		}
		now := s.now()
		claims, err := s.cfg.Signer.Verify(tok, now)
		if err != nil {
			msg := "invalid token"
			if errors.Is(err, ErrTokenExpired) {
				msg = "token has expired"
			}
			fail(c, http.StatusUnauthorized, "unauthorized", msg)
			return
		}
		ctx, cancel := s.queryCtx(c)
		defer cancel()
		revoked, err := s.cfg.Store.IsRevoked(ctx, claims.ID, now)
		if err != nil {
			s.storeFail(c, err)
			return
		}
		if revoked {
			fail(c, http.StatusUnauthorized, "unauthorized", "token has been revoked")
			return
		}
		c.Set(identityKey, identity{key: claims.Key, claims: claims})
	}
}

func who(c *gin.Context) identity {
	v, _ := c.Get(identityKey)
	id, _ := v.(identity)
	return id
}

// resolveKey decides whose data a request reads: the admin must name key=;
// a portal token reads its own key, and naming another is 403.
func resolveKey(c *gin.Context, requested string) (string, bool) {
	id := who(c)
	if id.admin {
		if requested == "" {
			fail(c, http.StatusBadRequest, "invalid_request", "key is required with the admin token")
			return "", false
		}
		return requested, true
	}
	if requested != "" && requested != id.key {
		fail(c, http.StatusForbidden, "forbidden", "this token may read its own key's usage only")
		return "", false
	}
	return id.key, true
}

type seriesPoint struct {
	Start string `json:"start"`
	Scope string `json:"scope"`
	// Region is present with group_by=region: the deciding limiters'
	// region, "" for usage recorded without one.
	Region   *string `json:"region,omitempty"`
	Requests uint64  `json:"requests"`
	Allowed  uint64  `json:"allowed"`
	Rejected uint64  `json:"rejected"`
	Cost     uint64  `json:"cost"`
	Warnings uint64  `json:"warnings"`
}

type usageResponse struct {
	Key    string        `json:"key"`
	Window Window        `json:"window"`
	From   string        `json:"from"`
	To     string        `json:"to"`
	TZ     string        `json:"tz"`
	Source string        `json:"source"` // the rollup table read
	Series []seriesPoint `json:"series"`
	Totals Counts        `json:"totals"`
	// Units is the cost unit the policy in force names for each scope of
	// the series ("tokens"); a scope whose policy names none is left out,
	// and so is every scope without a policy file (Config.PolicyPath).
	Units map[string]string `json:"units,omitempty"`
}

// AllScopes is the scope of series points summed over every scope.
const AllScopes = "*"

// seriesRequest reads a series request's parameters and the key the
// caller may read (GET /v1/usage, GET /v1/slots); false once it has
// answered the error.
func (s *Server) seriesRequest(c *gin.Context) (UsageParams, string, bool) {
	p, err := ParseUsageParams(c.Request.URL.Query(), s.now())
	if err != nil {
		fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return p, "", false
	}
	key, ok := resolveKey(c, p.Key)
	return p, key, ok
}

func (s *Server) getUsage(c *gin.Context) {
	p, key, ok := s.seriesRequest(c)
	if !ok {
		return
	}
	q := planUsage(s.cfg.Store.db, p, key)
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	read := s.cfg.Store.usage
	if p.GroupByRegion {
		read = s.cfg.Store.usageByRegion
	}
	pts, err := read(ctx, q)
	if err != nil {
		s.storeFail(c, err)
		return
	}
	if len(pts) > MaxPoints {
		fail(c, http.StatusBadRequest, "too_many_points", fmt.Sprintf("the answer would have more than %d points: narrow the range, widen the window or filter by scope", MaxPoints))
		return
	}
	resp := usageResponse{Key: key, Window: p.Window, TZ: p.Loc.String(), Source: q.table,
		From: p.From.In(p.Loc).Format(time.RFC3339), To: p.To.In(p.Loc).Format(time.RFC3339),
		Series: make([]seriesPoint, 0, len(pts))}
	for _, pt := range pts {
		scope := pt.Scope
		if !p.GroupByScope {
			scope = AllScopes
			if p.Scope != "" {
				scope = p.Scope
			}
		}
		sp := seriesPoint{Start: pt.Start.In(p.Loc).Format(time.RFC3339), Scope: scope,
			Requests: pt.Requests, Allowed: pt.Allowed, Rejected: pt.Rejected, Cost: pt.Cost, Warnings: pt.Warnings}
		if p.GroupByRegion {
			sp.Region = &pt.Region
		}
		resp.Series = append(resp.Series, sp)
		resp.Totals.add(pt.Counts)
	}
	resp.Units = s.units(key, resp.Series)
	c.JSON(http.StatusOK, resp)
}

// units is the cost unit of each named scope of series under the policy
// in force (Usage.Units); nil without a policy or when it names none.
func (s *Server) units(key string, series []seriesPoint) map[string]string {
	if s.policy == nil {
		return nil
	}
	pol, err := s.policy.Get()
	if err != nil {
		return nil // the usage itself does not depend on the policy
	}
	var out map[string]string
	seen := map[string]bool{AllScopes: true}
	for _, pt := range series {
		if seen[pt.Scope] {
			continue
		}
		seen[pt.Scope] = true
		if res, err := pol.Resolve(key, pt.Scope, ""); err == nil && res.Unit != "" {
			if out == nil {
				out = make(map[string]string)
			}
			out[pt.Scope] = res.Unit
		}
	}
	return out
}

func (s *Server) getTopKeys(c *gin.Context) {
	p, err := ParseTopKeysParams(c.Request.URL.Query(), s.now())
	if err != nil {
		fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	q := planTopKeys(s.cfg.Store.db, p)
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	keys, err := s.cfg.Store.topKeys(ctx, q)
	if err != nil {
		s.storeFail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"from": p.From.Format(time.RFC3339), "to": p.To.Format(time.RFC3339), "keys": keys})
}

type tokenRequest struct {
	Key        string `json:"key"`
	TTLSeconds *int64 `json:"ttl_seconds"`
}

func (s *Server) postPortalToken(c *gin.Context) {
	var req tokenRequest
	dec := json.NewDecoder(http.MaxBytesReader(c.Writer, c.Request.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(c, http.StatusRequestEntityTooLarge, "too_large", "body over 64 KiB")
			return
		}
		fail(c, http.StatusBadRequest, "invalid_request", "body must be JSON {\"key\": \"...\", \"ttl_seconds\": 3600}: "+err.Error())
		return
	}
	if msg := checkText(req.Key, MaxKeyLen); msg != "" {
		fail(c, http.StatusBadRequest, "invalid_request", "key "+msg)
		return
	}
	ttl := time.Hour
	if req.TTLSeconds != nil {
		ttl = time.Duration(*req.TTLSeconds) * time.Second
		if *req.TTLSeconds < 1 || ttl > s.cfg.MaxTokenTTL {
			fail(c, http.StatusBadRequest, "invalid_request", fmt.Sprintf("ttl_seconds must be from 1 to %d", int64(s.cfg.MaxTokenTTL/time.Second)))
			return
		}
	}
	now := s.now()
	tok, claims, err := s.cfg.Signer.Issue(req.Key, now, ttl)
	if err != nil {
		s.storeFail(c, err)
		return
	}
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	if err := s.cfg.Store.RecordIssued(ctx, claims, now); err != nil {
		s.storeFail(c, err)
		return
	}
	s.log.Info("portal token issued", "id", claims.ID, "key", claims.Key, "expires_at", claims.ExpiresAt())
	c.JSON(http.StatusCreated, gin.H{"id": claims.ID, "token": tok, "key": claims.Key, "expiresAt": claims.ExpiresAt().Format(time.RFC3339)})
}

func (s *Server) deletePortalToken(c *gin.Context) {
	id := c.Param("id")
	if !validTokenID(id) {
		fail(c, http.StatusBadRequest, "invalid_request", "id must be a portal token id (pt_ followed by 32 hex digits)")
		return
	}
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	found, err := s.cfg.Store.Revoke(ctx, id, s.now())
	if err != nil {
		s.storeFail(c, err)
		return
	}
	if !found {
		fail(c, http.StatusNotFound, "not_found", "no portal token with this id was issued")
		return
	}
	s.log.Info("portal token revoked", "id", id)
	c.Status(http.StatusNoContent)
}

func validTokenID(id string) bool {
	if len(id) != 35 || !strings.HasPrefix(id, "pt_") {
		return false
	}
	for _, r := range id[3:] {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

var deliveriesParamNames = map[string]bool{"key": true, "delivery_id": true, "limit": true}

func (s *Server) getDeliveries(c *gin.Context) {
	var p problems
	single := singles(c.Request.URL.Query(), deliveriesParamNames, &p)
	q := deliveriesQuery{db: s.cfg.Store.db, limit: 100}
	if k, ok := single["key"]; ok {
		if msg := checkText(k, MaxKeyLen); msg != "" {
			p.add("key %s", msg)
		}
		q.key = k
	}
	if d, ok := single["delivery_id"]; ok {
		if msg := checkText(d, 128); msg != "" {
			p.add("delivery_id %s", msg)
		}
		q.deliveryID = d
	}
	if l, ok := single["limit"]; ok {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			p.add("limit must be an integer from 1 to 1000")
		}
		q.limit = n
	}
	if err := p.err(); err != nil {
		fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	ds, err := s.cfg.Store.deliveries(ctx, q)
	if err != nil {
		s.storeFail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"attempts": ds})
}
